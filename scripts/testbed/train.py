"""Train a DSpark drafter against the testbed's target on its self-distilled data, with
DeepSpec's objective (``deepspec/modeling/dspark/loss.py``, its 4B config's weights): over
teacher-forced blocks (``blocks.py``), 0.1 x the cross-entropy with the true next tokens
plus 0.9 x the L1 distance between the draft and target distributions (twice the total
variation, so ``1 - TV`` is a position's acceptance rate), plus the confidence head's binary
cross-entropy against that rate; each position weighted ``exp(-j / 4)``. The drafter shares
the target's embedding and lm_head (frozen, as speculators checkpoints leave them to the
verifier) and is saved as a speculators checkpoint whose lane is
``conf/lane/smollm2_135m.yaml``. Every ``--validate-every`` steps the drafter drafts the
held-out prompts' greedy answers (``evaluate.validate``): the curve of acceptance against
training time.

    python scripts/testbed/train.py --target testbed/target --out testbed/drafter
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from blocks import Blocks, context, target_pass, teacher_forced
from data import DATA, load
from dspark_compile import LaneConfig, lane_config, random_drafter, save_checkpoint
from dspark_compile.checkpoint import cast_drafter
from dspark_compile.model import Drafter
from evaluate import held_out_blocks, validate
from target import LANE, load_target

CE, L1, CONFIDENCE, DECAY = 0.1, 0.9, 1.0, 4.0  # DeepSpec's loss weights and position decay


def training_lane(lane: LaneConfig) -> LaneConfig:
    """The lane in fp32 with the reference paths: the fast paths are inference kernels."""
    return lane.replace(dtype="float32", fused_markov_step=False, fused_attention=False)


def batches(sequences: list[Tensor], prompt_lengths: list[int], batch: int, length: int,
            k: int, rng: random.Random):
    """Endless batches ``(tokens [B, length], valid [B], first anchor [B])``: a window of
    each sequence (zero-padded), whose anchors may sit in its answer only."""
    order = [i for i, s in enumerate(sequences) if len(s) - prompt_lengths[i] > k + 1]
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - batch + 1, batch):
            tokens = torch.zeros(batch, length, dtype=torch.long)
            valid, first = [], []
            for row, i in enumerate(order[start:start + batch]):
                sequence, prompt = sequences[i], prompt_lengths[i]
                offset = rng.randint(0, max(0, len(sequence) - length))
                window = sequence[offset:offset + length]
                tokens[row, :len(window)] = window
                valid.append(len(window))
                first.append(max(1, prompt - offset))
            yield tokens, torch.tensor(valid), torch.tensor(first)


def anchors_in(valid: Tensor, first: Tensor, k: int, anchors: int, gen: torch.Generator
               ) -> tuple[Tensor, Tensor]:
    """``anchors`` random anchors per sequence in ``[first, valid - k - 1]``: (rows, s)."""
    B, device = valid.shape[0], valid.device
    span = (valid - k - first).clamp_min(1)
    s = first[:, None] + (torch.rand(B, anchors, generator=gen, device=device)
                          * span[:, None]).long()
    return torch.arange(B, device=device).repeat_interleave(anchors), s.reshape(-1)


def loss(blocks: Blocks) -> tuple[Tensor, dict[str, Tensor]]:
    """DeepSpec's objective over the blocks, and what to report about them."""
    k = blocks.z.shape[1]
    weight = torch.exp(-torch.arange(k, device=blocks.z.device) / DECAY).expand(
        blocks.z.shape[0], k)
    mean = lambda x: (x * weight).sum() / weight.sum()  # noqa: E731
    ce = F.cross_entropy(blocks.z.flatten(0, 1), blocks.labels.flatten(), reduction="none")
    q = blocks.z.softmax(-1)
    p = blocks.target_logits.float().softmax(-1)
    l1 = (q - p).abs().sum(-1)
    accept = (1 - 0.5 * l1.detach()).clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(blocks.confidence_logits, accept, reduction="none")
    total = CE * mean(ce.view_as(l1)) + L1 * mean(l1) + CONFIDENCE * mean(bce)
    metrics = {"ce": ce.mean().detach(), "l1": l1.mean().detach(), "bce": bce.mean().detach(),
               "accept": accept.mean(0),
               "top1": (blocks.z.argmax(-1) == blocks.labels).float().mean(0)}
    return total, metrics


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
          device: torch.device, validation: Optional[tuple[list[Tensor], list[int]]] = None,
          validate_every: int = 500, log_every: int = 100, max_seconds: float = float("inf")
          ) -> tuple[Drafter, list[float], list[dict]]:
    """A drafter of ``lane`` trained ``steps`` steps against ``target``, in ``lane``'s
    dtype; its cross-entropy at each step; and, with ``validation`` (greedy answers and
    their prompt lengths), its greedy acceptance on them every ``validate_every`` steps
    and at the end; stops early after ``max_seconds``. Prints the losses and the
    teacher-forced top-1 per block position."""
    torch.manual_seed(seed)
    drafter = make_drafter(target, lane, device, seed)
    trained = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 25)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        (step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * step / steps))))
    data = batches(sequences, prompt_lengths, batch, length, lane.k, random.Random(seed))
    gen = torch.Generator(device=device).manual_seed(seed)
    start, history, curve = time.perf_counter(), [], []
    for step in range(steps):
        if time.perf_counter() - start > max_seconds:
            print(f"stopping at step {step} of {steps}: {max_seconds:.0f} s", flush=True)
            break
        if validation and (step % validate_every == 0):
            curve.append(validation_point(drafter, target, validation, device, step,
                                               time.perf_counter() - start))
        tokens, valid, first = (t.to(device) for t in next(data))
        features, logits = target_pass(target, tokens, lane.target_layer_ids)
        rows, s = anchors_in(valid, first, lane.k, anchors, gen)
        blocks = teacher_forced(drafter, context(drafter, features, valid), tokens, logits,
                                rows, s)
        total, metrics = loss(blocks)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        history.append(float(metrics["ce"]))
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step}: ce {metrics['ce']:.3f} l1 {metrics['l1']:.3f} "
                  f"bce {metrics['bce']:.3f} top1 "
                  f"{' '.join(f'{a:.2f}' for a in metrics['top1'].tolist())} "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
    if validation:
        curve.append(validation_point(drafter, target, validation, device, len(history),
                                           time.perf_counter() - start))
    return cast_drafter(drafter.eval(), lane.dtype), history, curve


def validation_point(drafter: Drafter, target, validation, device: torch.device,
                          step: int, seconds: float) -> dict:
    drafter.eval()
    result = dict(step=step, seconds=round(seconds, 1),
                  **validate(held_out_blocks(drafter, target, *validation, device)))
    drafter.train()
    print(f"validation at step {step}: {result['tokens_per_round']:.3f} tokens/round greedy, "
          f"{result['t1_tokens_per_round_estimate']:.3f} at T = 1 (estimate)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=Path("testbed/drafter"))
    parser.add_argument("--curve", type=Path, default=Path("bench_out/testbed_curve.json"))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=320)
    parser.add_argument("--anchors", type=int, default=32, help="blocks per sequence")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--validate-every", type=int, default=500)
    parser.add_argument("--max-seconds", type=float, default=float("inf"),
                        help="stop early after this long (the schedule is not rescaled)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high")  # TF32 here; evaluate.py runs in full fp32
    torch.manual_seed(args.seed)
    target = load_target(args.target, device)
    data = load(args.data)
    sequences, prompt_lengths = data.select(held_out=False)
    drafter, _, curve = train(target, lane_config(LANE), sequences, prompt_lengths, args.steps,
                              args.batch, args.length, args.anchors, args.lr, args.seed, device,
                              data.select(held_out=True, modes=("greedy",)),
                              args.validate_every, max_seconds=args.max_seconds)
    save_checkpoint(drafter, args.out, "speculators", verifier=args.target)
    args.curve.parent.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    args.curve.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()},
                                          device_name=device_name, curve=curve), indent=2))
    print(args.out)


if __name__ == "__main__":
    main()
