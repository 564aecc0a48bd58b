"""Seeded multi-round inputs, shaped as a target hands them to the drafter.

Round 0 carries each request's prompt (lengths differ, so the shorter ones are padded);
each later round carries the accepted rows plus the bonus row (n = accepted + 1 <= k + 1)
and a new anchor. With ``fixed`` every prompt has ``context`` rows and every later round
k + 1 (the benchmark's shapes). The same seed on the same device gives the same rounds in
any process.
"""

from __future__ import annotations

from typing import Iterator

import torch

from dspark_compile.config import LaneConfig
from dspark_compile.draft import RoundInputs


def context_needed(lane: LaneConfig, context: int, rounds: int) -> int:
    """The largest anchor position :func:`synthetic_rounds` can reach."""
    return context + (rounds - 1) * (lane.k + 1)


def synthetic_rounds(lane: LaneConfig, batch: int, context: int, rounds: int, seed: int,
                     device: torch.device | str, temperature: float = 0.0,
                     fixed: bool = False) -> Iterator[RoundInputs]:
    """``temperature`` > 0 samples the odd rows at that temperature and keeps the even rows
    greedy: a mixed batch. At 0 the rounds leave temperature and seed out (the defaults)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    temperatures = torch.tensor([temperature * (r % 2) for r in range(batch)],
                                dtype=torch.float32, device=device)
    sample_seeds = torch.randint(0, 1 << 32, (batch,), generator=gen, device=device)

    def ints(low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, (batch,), generator=gen, device=device)

    num_new = ints(context if fixed else context // 2 + 1, context + 1)  # prompt lengths
    anchor_pos = num_new.clone()
    width = context
    for round_index in range(rounds):
        if round_index:
            num_new = ints(lane.k if fixed else 0, lane.k + 1) + 1
            anchor_pos = anchor_pos + num_new
            width = lane.k + 1
        features = torch.randn(batch, width, lane.feature_size, generator=gen, device=device,
                               dtype=lane.torch_dtype)
        anchor = ints(0, lane.target_vocab_size)
        if temperature > 0:
            yield RoundInputs(features, num_new, anchor, anchor_pos, temperatures, sample_seeds)
        else:
            yield RoundInputs(features, num_new, anchor, anchor_pos)
