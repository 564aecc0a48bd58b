"""Train a DSpark drafter against the testbed's target, on its self-distilled data, with the
DeepSpec objective: the block's cross-entropy with the Markov head fed the true previous
tokens, and the confidence head's binary cross-entropy against each position's acceptance
rate ``1 - TV(q, p)`` (draft against target). The drafter shares the target's embedding and
lm_head (frozen, as speculators checkpoints leave them to the verifier) and is saved as a
speculators checkpoint whose lane is ``conf/lane/smollm2_135m.yaml``.

    python scripts/testbed/train.py --target testbed/target \
        --out testbed/drafter --steps 2000
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from data import DATA, load
from dspark_compile import KVCache, LaneConfig, lane_config, random_drafter, save_checkpoint
from dspark_compile.checkpoint import cast_drafter
from dspark_compile.model import Drafter
from target import load_target

LANE = "smollm2_135m"


def training_lane(lane: LaneConfig) -> LaneConfig:
    """The lane in fp32 with the reference paths: the fast paths are inference kernels."""
    return lane.replace(dtype="float32", fused_markov_step=False, flex_attention=False)


def batches(sequences: list[Tensor], prompt_lengths: list[int], batch: int, length: int,
            k: int, rng: random.Random):
    """Endless batches ``(tokens [B, length], valid [B], first anchor [B])``: a window of
    each sequence (zero-padded), whose anchors may sit in its response only."""
    order = [i for i, s in enumerate(sequences) if len(s) - prompt_lengths[i] > k + 1]
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - batch + 1, batch):
            tokens = torch.zeros(batch, length, dtype=torch.long)
            valid, first = [], []
            for row, i in enumerate(order[start:start + batch]):
                sequence, prompt = sequences[i], prompt_lengths[i]
                offset = max(0, rng.randint(0, max(0, len(sequence) - length)))
                window = sequence[offset:offset + length]
                tokens[row, :len(window)] = window
                valid.append(len(window))
                first.append(max(1, prompt - offset))
            yield tokens, torch.tensor(valid), torch.tensor(first)


@torch.no_grad()
def target_pass(target, tokens: Tensor, taps: list[int]) -> tuple[Tensor, Tensor]:
    """The target's features ``[B, T, F]`` and logits ``[B, T, V]`` of padded sequences (a
    causal model: padding after a sequence changes none of its positions)."""
    out = target(tokens, output_hidden_states=True)
    features = torch.cat([out.hidden_states[t + 1] for t in taps], dim=-1)
    return features, out.logits


def block_loss(drafter: Drafter, tokens: Tensor, valid: Tensor, first: Tensor,
               features: Tensor, target_logits: Tensor, anchors: int, gen: torch.Generator
               ) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of ``anchors`` blocks per sequence, and what to report about them."""
    lane, device = drafter.lane, tokens.device
    B, T = tokens.shape
    k = lane.k
    cache = KVCache.allocate(lane, B, device, max_context=T)
    drafter.append_context(cache.k, cache.v, features.to(lane.torch_dtype), valid, valid)
    # anchors s in [first, valid - k - 1]: the block predicts s+1 .. s+k, all real tokens
    span = (valid - k - first).clamp_min(1)
    s = first[:, None] + (torch.rand(B, anchors, generator=gen, device=device)
                          * span[:, None]).long()
    rows = torch.arange(B, device=device).repeat_interleave(anchors)
    s = s.reshape(-1)
    steps = torch.arange(k, device=device)
    # functionalized: each layer writes its block into the cache another layer's attention
    # saved for the backward pass; out of place, every version stays what it was
    h, base = torch.func.functionalize(drafter)(cache.k[rows], cache.v[rows], tokens[rows, s], s)
    prevs = tokens[rows[:, None], s[:, None] + steps]      # the anchor, then the true tokens
    labels = tokens[rows[:, None], s[:, None] + 1 + steps]
    head = drafter.markov_head
    z = (base + head.step_bias(prevs.reshape(-1), h.reshape(-1, h.shape[-1]), None)[0]
         .view_as(base)).float()
    ce = F.cross_entropy(z.reshape(-1, z.shape[-1]), labels.reshape(-1))
    with torch.no_grad():
        p = torch.softmax(target_logits[rows[:, None], s[:, None] + steps].float(), -1)
        accept = (1 - 0.5 * (torch.softmax(z, -1) - p).abs().sum(-1)).clamp(0, 1)
    confidence = drafter.confidence_head.proj(torch.cat([h, head.markov_w1(prevs)], -1))
    bce = F.binary_cross_entropy_with_logits(confidence.squeeze(-1).float(), accept)
    metrics = {"ce": ce.detach(), "bce": bce.detach(), "accept": accept.mean(0),
               "top1": (z.argmax(-1) == labels).float().mean(0)}
    return ce + bce, metrics


def make_drafter(target, lane: LaneConfig, device: torch.device, seed: int) -> Drafter:
    """Seeded random layers and heads in fp32; the target's embedding and lm_head."""
    drafter = random_drafter(training_lane(lane), device, seed)
    embedding = target.get_input_embeddings().weight.detach().float()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(embedding)
        drafter.lm_head.weight.copy_(target.get_output_embeddings().weight.detach().float())
    drafter.embed_tokens.weight.requires_grad_(False)
    drafter.lm_head.weight.requires_grad_(False)
    return drafter.train()


def train(target, lane: LaneConfig, sequences: list[Tensor], prompt_lengths: list[int],
          steps: int, batch: int, length: int, anchors: int, lr: float, seed: int,
          device: torch.device, log_every: int = 100) -> tuple[Drafter, list[float]]:
    """A drafter of ``lane`` trained ``steps`` steps against ``target``, in ``lane``'s
    dtype, and its cross-entropy at each step; prints the losses and the teacher-forced
    top-1 per block position."""
    torch.manual_seed(seed)
    drafter = make_drafter(target, lane, device, seed)
    trained = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        (step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * step / steps))))
    data = batches(sequences, prompt_lengths, batch, length, lane.k, random.Random(seed))
    gen = torch.Generator(device=device).manual_seed(seed)
    start, history = time.perf_counter(), []
    for step in range(steps):
        tokens, valid, first = (t.to(device) for t in next(data))
        features, logits = target_pass(target, tokens, lane.target_layer_ids)
        loss, metrics = block_loss(drafter, tokens, valid, first, features, logits, anchors,
                                   gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        history.append(float(metrics["ce"]))
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step}: ce {metrics['ce']:.3f} bce {metrics['bce']:.3f} "
                  f"top1 {' '.join(f'{a:.2f}' for a in metrics['top1'].tolist())} "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
    return cast_drafter(drafter.eval(), lane.dtype), history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=Path("testbed/drafter"))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=320)
    parser.add_argument("--anchors", type=int, default=8, help="blocks per sequence")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    target = load_target(args.target, device)
    sequences, prompt_lengths, _ = load(args.data)
    drafter, _ = train(target, lane_config(LANE), sequences, prompt_lengths, args.steps,
                       args.batch, args.length, args.anchors, args.lr, args.seed, device)
    save_checkpoint(drafter, args.out, "speculators", verifier=args.target)
    print(args.out)


if __name__ == "__main__":
    main()
