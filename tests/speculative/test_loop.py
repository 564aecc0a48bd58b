"""The draft -> verify loop with a real target architecture (a small random Qwen3 from
transformers behind the loop's Target protocol), checked against the target generating
alone, one token per forward."""

import numpy as np
import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.config import lane_config
from dspark_compile.errors import ConfigError, InputError
from dspark_compile.runtime import load_runner
from dspark_compile.speculative import MaxDraftRows, Request, acceptance, decode, loop
from dspark_compile.runtime.schedule import StepsPerSecond, verify_lengths

transformers = pytest.importorskip("transformers", reason="the end-to-end tests need "
                                   "transformers: pip install -e '.[dev]'")


class RecomputingTarget:
    """A transformers causal LM as the loop's target: every pass recomputes each row's whole
    sequence (no KV cache), simple enough to trust."""

    def __init__(self, model: torch.nn.Module, rows: int, taps: list[int]):
        self.model, self.rows, self.taps = model, rows, taps
        self.sequences: list[list[int]] = [[] for _ in range(rows)]

    def forward(self, sequences: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each sequence's logits and features; sequences of one length in one batch."""
        results = [None] * len(sequences)
        for length in {len(s) for s in sequences}:
            rows = [i for i, s in enumerate(sequences) if len(s) == length]
            out = self.model(torch.tensor([sequences[i] for i in rows], device=self.model.device),
                             output_hidden_states=True)
            # hidden_states[0] is the embeddings: target layer i is index i + 1
            features = torch.cat([out.hidden_states[t + 1] for t in self.taps], -1)
            for j, i in enumerate(rows):
                results[i] = (out.logits[j].float(), features[j])
        return results

    def prefill(self, rows, prompts):
        for row, prompt in zip(rows, prompts):
            self.sequences[row] = list(prompt)
        passes = self.forward([list(p) for p in prompts])
        features = passes[0][1].new_zeros(len(rows), max(map(len, prompts)),
                                          passes[0][1].shape[-1])
        for i, (_, f) in enumerate(passes):
            features[i, :len(f)] = f
        return torch.stack([logits[-1] for logits, _ in passes]), features

    def verify(self, tokens, start):
        n, starts = tokens.shape[1], start.tolist()
        for row, s in enumerate(starts):
            self.sequences[row] = self.sequences[row][:s] + tokens[row].tolist()
        passes = self.forward(self.sequences)
        return (torch.stack([logits[s:s + n] for (logits, _), s in zip(passes, starts)]),
                torch.stack([features[s:s + n] for (_, features), s in zip(passes, starts)]))


def qwen3_target(vocab: int, seed: int, device) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024)
    return transformers.Qwen3ForCausalLM(config).to(device).eval()


@torch.no_grad()
def target_greedy(target, prompt: list[int], new_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(new_tokens):
        tokens.append(int(target(torch.tensor([tokens], device=target.device)).logits[0, -1]
                          .argmax()))
    return tokens[len(prompt):]


def runner_for(lane, drafter_seed, rows, tmp_path, device, with_probs=False):
    drafter = random_drafter(lane, device, seed=drafter_seed)
    path, _ = build_artifact(drafter, "eager", [rows], tmp_path, with_probs=with_probs)
    return load_runner(path, device)


@pytest.mark.parametrize("lane_name,drafter_seed", [("tiny", 0), ("tiny", 1), ("tiny_d2t", 2)])
def test_greedy_decoding_is_the_targets_own_output_with_rows_refilled(
        tmp_path, device, lane_name, drafter_seed):
    target = qwen3_target(512, seed=5, device=device)
    lane = lane_config(lane_name)
    runner = runner_for(lane, drafter_seed, 2, tmp_path, device)
    requests = [Request([1, 2, 3], 24), Request([400, 17, 17, 9, 250, 3, 77], 9),
                Request(list(range(40, 60)), 17), Request([5], 1)]
    decoded = decode(RecomputingTarget(target, 2, lane.target_layer_ids), runner, requests)
    for request, completion in zip(requests, decoded.completions):
        assert completion.tokens == target_greedy(target, request.prompt,
                                                  request.max_new_tokens)
        # the prompt's pass gives the first token, the rounds the rest, k+1 at most each
        assert len(completion.accepted) >= (request.max_new_tokens - 1) / (lane.k + 1)
        assert all(len(c) == lane.k for c in completion.confidences)
    assert len(runner._rows) == 0  # every slot released


def random_lengths(seed: int):
    """A schedule of verify lengths drawn at random: any lengths must keep the output."""
    generator = torch.Generator().manual_seed(seed)

    def schedule(confidences):
        return torch.randint(0, confidences.shape[1] + 1, confidences.shape[:1],
                             generator=generator).to(confidences.device)
    return schedule


@pytest.mark.parametrize("schedule", ["algorithm 1", "in the runner's graph",
                                      "by width in the runner's graph", "two rounds old",
                                      "random"])
def test_greedy_decoding_with_scheduled_verify_lengths_is_still_the_targets_output(
        tmp_path, device, schedule):
    target = qwen3_target(512, seed=5, device=device)
    lane = lane_config("tiny")
    runner = runner_for(lane, 0, 2, tmp_path, device)
    sps = StepsPerSecond((1, 12), (1000.0, 250.0))  # a step of 12 tokens costs 4 of one
    chosen, lag = (lambda c: verify_lengths(c, sps)), 2 if schedule == "two rounds old" else 0
    if lag:  # the runner's, over each request's confidences of two rounds before
        chosen = None
        runner.schedule(sps, lag=lag)
    elif schedule == "random":
        chosen = random_lengths(1)
    elif schedule == "in the runner's graph":
        chosen = None
        runner.schedule(sps)
    elif schedule.startswith("by width"):  # two rows, each as wide as the widest
        chosen = None
        runner.schedule(StepsPerSecond((1, 6), (1000.0, 250.0), by="width"))
    requests = [Request([1, 2, 3], 20), Request(list(range(40, 60)), 13), Request([9, 9], 7)]
    decoded = decode(RecomputingTarget(target, 2, lane.target_layer_ids), runner, requests,
                     schedule=chosen)
    for request, completion in zip(requests, decoded.completions):
        assert completion.tokens == target_greedy(target, request.prompt,
                                                  request.max_new_tokens)
        assert all(a <= v for a, v in zip(completion.accepted, completion.verified))
        if lag:  # a request's first rounds have no confidences that old: every draft
            assert completion.verified[:lag] == [lane.k] * lag
    verified = [v for c in decoded.completions for v in c.verified]
    assert min(verified) < lane.k  # the schedule shortened some rounds


def test_a_drafter_that_agrees_with_the_target_gets_every_draft_accepted(tmp_path, device):
    """Zero output heads on both sides: every logit ties and the lowest index, 0, wins on
    the target and in the drafter alike, so every draft is accepted."""
    target = qwen3_target(512, seed=6, device=device)
    lane = lane_config("tiny")
    runner = runner_for(lane, 3, 1, tmp_path, device)
    with torch.no_grad():
        target.lm_head.weight.zero_()
        runner.drafter.lm_head.weight.zero_()
        runner.drafter.markov_head.markov_w2.weight.zero_()
    decoded = decode(RecomputingTarget(target, 1, lane.target_layer_ids), runner,
                     [Request([1, 2, 3], 20)])
    (completion,) = decoded.completions
    assert completion.tokens == [0] * 20
    assert completion.accepted == [lane.k] * len(completion.accepted)


@pytest.mark.parametrize("request_", [Request([], 3), Request([1, 2], 0)])
def test_a_request_without_a_prompt_or_tokens_to_make_is_refused_by_name(
        tmp_path, device, request_):
    lane = lane_config("tiny")
    target = RecomputingTarget(qwen3_target(512, seed=5, device=device), 1,
                               lane.target_layer_ids)
    with pytest.raises(InputError, match=r"requests\[1\]"):
        decode(target, runner_for(lane, 0, 1, tmp_path, device), [Request([1], 2), request_])


def test_sampling_needs_an_artifact_with_the_draft_distribution(tmp_path, device):
    lane = lane_config("tiny")
    target = RecomputingTarget(qwen3_target(512, seed=5, device=device), 1,
                               lane.target_layer_ids)
    with pytest.raises(ConfigError, match="with_probs"):
        decode(target, runner_for(lane, 0, 1, tmp_path, device), [Request([1], 2)], 1.0)


def none_verified(confidences):
    return torch.zeros(confidences.shape[0], dtype=torch.long, device=confidences.device)


# the token this test observes follows a round's first draft: with no draft verified it is
# the target's own sample, never a correction of the draft
@pytest.mark.parametrize("schedule", [None, none_verified, "algorithm 1", "own steps"],
                         ids=["every draft", "none verified", "algorithm 1 in the graph",
                              "the target's own steps"])
def test_sampling_follows_the_target_distribution(tmp_path, device, schedule):
    """Over many seeded requests, 8 rows at a time, the second generated token (the first
    the loop's verification emits) follows the target's own distribution at temperature 1,
    verifying every draft, as many as a schedule says, or none drafted (rounds of the
    target's own steps): chi-square against the exact mixture sum_x1 p(x1) p(x2 | x1)."""
    vocab = 8
    lane = lane_config("tiny", target_vocab_size=vocab, draft_vocab_size=vocab, mask_token_id=7)
    target = qwen3_target(vocab, seed=7, device=device)
    with torch.no_grad():  # peaked distributions, far from the drafter's and from uniform
        target.lm_head.weight.mul_(8)
    runner = runner_for(lane, 4, 8, tmp_path, device, with_probs=True)
    scheduled, own = schedule == "algorithm 1", schedule == "own steps"
    if own:
        schedule = None
    if scheduled:  # a step of 48 tokens costs 12 of one: lengths 0 .. k
        runner.schedule(StepsPerSecond((8, 48), (1000.0, 250.0)))
        schedule = None
    prompt, runs = [1, 5, 2], 1500
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt], device=device)).logits[0, -1], -1)
        following = torch.stack([torch.softmax(target(torch.tensor(
            [prompt + [x]], device=device)).logits[0, -1], -1) for x in range(vocab)])
    expected = (p1[:, None] * following).sum(0).double().cpu().numpy()
    decoded = decode(RecomputingTarget(target, 8, lane.target_layer_ids), runner,
                     [Request(prompt, 2, seed=seed) for seed in range(runs)], 1.0, schedule,
                     drafting=MaxDraftRows(0) if own else None)
    counts = np.bincount([c.tokens[1] for c in decoded.completions], minlength=vocab)
    statistic = float(((counts - expected * runs) ** 2 / (expected * runs)).sum())
    assert statistic < 24.3  # chi-square, 7 degrees of freedom, 99.9th percentile
    # the drafter is not the target: corrections were exercised (own steps: no drafts)
    if own:
        assert all(c.accepted == [] for c in decoded.completions)
    else:
        assert any(c.accepted[0] == 0 for c in decoded.completions)
    if scheduled:  # rounds of several lengths
        assert len({c.verified[0] for c in decoded.completions}) > 1


def test_each_positions_acceptance_is_the_overlap_of_the_two_distributions(
        tmp_path, device, monkeypatch):
    """Over the loop's sampled rounds, draft j is accepted, where reached, as often as
    ``sum_v min(p_j(v), q_j(v))`` says on average over those rounds (p the target's, q the
    drafter's distribution): within four standard errors, at the first two positions."""
    vocab = 8
    lane = lane_config("tiny", target_vocab_size=vocab, draft_vocab_size=vocab, mask_token_id=7)
    target = qwen3_target(vocab, seed=8, device=device)
    with torch.no_grad():
        target.lm_head.weight.mul_(4)
    runner = runner_for(lane, 5, 4, tmp_path, device, with_probs=True)
    seen = []

    def recording(drafted, q, logits, rows, temperature, *args):
        accepted, tokens = acceptance.verify_rows(drafted, q, logits, rows, temperature, *args)
        p = acceptance.target_probs(logits, rows, temperature)
        seen.append((torch.minimum(p[:, :q.shape[1]], q).sum(-1).cpu(), accepted.cpu()))
        return accepted, tokens
    monkeypatch.setattr(loop, "verify_rows", recording)
    decode(RecomputingTarget(target, 4, lane.target_layer_ids), runner,
           [Request([1, 5, 2, s % 7], 8, seed=s) for s in range(200)], 1.0)
    overlap = torch.cat([o for o, _ in seen]).double()  # [rounds, k]
    accepted = torch.cat([a for _, a in seen])
    for j in range(2):
        reached = accepted >= j
        expected = overlap[reached, j]
        realized = (accepted[reached] > j).double()
        error = float((expected * (1 - expected)).sum().sqrt() / reached.sum())
        assert abs(float(realized.mean() - expected.mean())) < 4 * error, (j, error)
        assert 0.2 < float(expected.mean()) < 0.95  # the drafts neither always nor never pass
