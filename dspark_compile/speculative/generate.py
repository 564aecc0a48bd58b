"""Speculative decoding end to end: a target model, a drafter runtime, draft -> verify.

The target is any causal LM that returns logits and hidden states (a Hugging Face model
with ``output_hidden_states=True``); its tapped layers feed the drafter. For clarity the
target re-reads the whole sequence each round (no target KV cache): this loop is for
correctness and examples, not speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dspark_compile.draft import RoundInputs
from dspark_compile.draft.sampling import sample
from dspark_compile.runtime import Runner
from dspark_compile.speculative.acceptance import verify_greedy, verify_sampling

FIRST_TOKEN_STREAM = (1 << 20) + 2  # the target's own first sample, apart from other noise


@dataclass
class Generation:
    tokens: list[int]                                   # prompt + generated
    accepted: list[int] = field(default_factory=list)   # drafts accepted, per round

    def acceptance_by_position(self, k: int) -> list[float]:
        """Fraction of rounds whose draft at position i was accepted."""
        rounds = max(len(self.accepted), 1)
        return [sum(a > i for a in self.accepted) / rounds for i in range(k)]


@torch.no_grad()
def target_pass(target: torch.nn.Module, tokens: Tensor, taps: list[int]
                ) -> tuple[Tensor, Tensor]:
    """Logits ``[T, V]`` and drafter features ``[T, taps x hidden]`` of one sequence."""
    out = target(tokens[None], output_hidden_states=True)
    # hidden_states[0] is the embeddings: target layer i is index i + 1
    features = torch.cat([out.hidden_states[i + 1][0] for i in taps], dim=-1)
    return out.logits[0].float(), features


@torch.no_grad()
def generate(target: torch.nn.Module, runner: Runner, prompt: list[int], max_new_tokens: int,
             temperature: float = 0.0, seed: int = 0) -> Generation:
    """Generate with speculative decoding: greedy (temperature 0) or lossless sampling,
    which needs an artifact built ``with_probs``."""
    lane, device = runner.lane, runner.device
    if temperature > 0 and not runner.manifest["with_probs"]:
        raise ValueError("sampling needs the draft distribution: build the artifact with "
                         "with_probs=True")
    taps, dtype = lane.target_layer_ids, lane.torch_dtype
    tokens = torch.tensor(prompt, device=device)
    logits, features = target_pass(target, tokens, taps)
    seeds = torch.tensor([seed], device=device)
    first = pick_target_token(logits[-1:], temperature, seeds, torch.tensor([len(prompt)], device=device))
    tokens = torch.cat([tokens, first])
    result = Generation(tokens=tokens.tolist())
    slot = runner.admit()
    try:
        new_features, anchor_pos = features, len(prompt)  # rows for positions 0 .. s-1
        while len(tokens) - len(prompt) < max_new_tokens:
            anchor = tokens[-1:]
            inputs = RoundInputs(new_features[None].to(dtype),
                                 torch.tensor([len(new_features)], device=device), anchor,
                                 torch.tensor([anchor_pos], device=device),
                                 torch.tensor([temperature], dtype=torch.float32, device=device),
                                 seeds)
            out = runner.draft(inputs, [slot])
            drafted = out.ids.to(device)  # the runner hands ids to the host
            logits, features = target_pass(target, torch.cat([tokens, drafted[0]]), taps)
            block = logits[anchor_pos:anchor_pos + lane.k + 1]  # predicts s+1 .. s+k+1
            position = torch.tensor([anchor_pos], device=device)
            if temperature > 0:
                p = torch.softmax(block / temperature, dim=-1)[None]
                accepted, emitted = verify_sampling(drafted, out.probs, p, seeds, position)
            else:
                accepted, emitted = verify_greedy(drafted, block.argmax(-1)[None])
            a = int(accepted[0])
            result.accepted.append(a)
            tokens = torch.cat([tokens, emitted[0, :a + 1]])
            # the anchor and the accepted drafts are now context, their features exact
            new_features = features[anchor_pos:anchor_pos + a + 1]
            anchor_pos += a + 1
    finally:
        runner.release(slot)
    result.tokens = tokens[:len(prompt) + max_new_tokens].tolist()
    return result


def pick_target_token(logits: Tensor, temperature: float, seed: Tensor, position: Tensor
                      ) -> Tensor:
    """The target's own token: argmax, or a Gumbel-max sample at the temperature (the draft
    step's own sampling, on a noise stream of its own)."""
    temperatures = torch.full(seed.shape, temperature, dtype=torch.float32, device=seed.device)
    return sample(logits, temperatures, seed, position, FIRST_TOKEN_STREAM)


@torch.no_grad()
def target_greedy(target: torch.nn.Module, prompt: list[int], max_new_tokens: int,
                  device: torch.device | str) -> list[int]:
    """The target's own greedy generation, one token per forward: the lossless reference."""
    tokens = torch.tensor(prompt, device=device)
    for _ in range(max_new_tokens):
        logits = target(tokens[None]).logits[0, -1]
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)])
    return tokens.tolist()
