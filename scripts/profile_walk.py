"""The fused Markov walk alone, a few rounds at one lane's shape, for a kernel profiler.

    ncu --clock-control none -k regex:_markov_step_kernel --launch-skip 35 --launch-count 1 \
        python scripts/profile_walk.py --lane qwen36_27b --batch 8

Random weights and base logits as ``markov_loop_bench.py`` draws them; greedy rows unless
``--sampled`` (then odd rows at T = 1). Each round is k launches of the step kernel, or one
of the resident walk (``-k regex:_markov_walk_kernel``) where the lane's W2 fits on chip.
"""

from __future__ import annotations

import argparse

import torch
from markov_loop_bench import random_head  # the sibling script: same weights

from dspark_compile.kernels import markov
from dspark_compile.config import lane_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="qwen36_27b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sampled", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    lane = lane_config(args.lane)
    gen = torch.Generator(device=device).manual_seed(0)
    head, d2t = random_head(lane, gen)
    R = args.batch
    base = torch.randn(R, lane.k, lane.draft_vocab_size, device=device, generator=gen,
                       dtype=lane.torch_dtype)
    temperature = (torch.arange(R, device=device) % 2).float() * args.sampled
    for _ in range(args.rounds):
        anchor = torch.randint(0, lane.target_vocab_size, (R,), device=device, generator=gen)
        markov.markov_walk(head.markov_w1.weight, head.markov_w2.weight, base, anchor,
                                 temperature, torch.arange(R, device=device) + 7,
                                 torch.full((R,), 4096, device=device), d2t)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
