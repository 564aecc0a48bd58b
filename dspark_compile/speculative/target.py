"""What the loop asks of the model it speeds up, and how it picks that model's own token."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from dspark_compile.draft.sampling import sample

FIRST_TOKEN_STREAM = (1 << 20) + 2  # the target's own first sample, apart from other noise


class Target(Protocol):
    """The model being sped up, as the loop calls it: ``rows`` KV caches, one request each.
    A pass writes its tokens' keys at their positions in a row and attends to that row's
    cache below them (what a longer earlier pass left beyond them is masked, then
    overwritten). Logits are fp32; features are the drafter's taps, concatenated."""

    rows: int

    def prefill(self, rows: list[int], prompts: list[list[int]]) -> tuple[Tensor, Tensor]:
        """The prompts into ``rows`` from position 0: each prompt's last logits
        ``[len(rows), V]`` and its features ``[len(rows), longest prompt, F]``."""

    def verify(self, tokens: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        """``tokens [rows, n]`` at positions ``start[r] + i`` in every row: logits
        ``[rows, n, V]`` and features ``[rows, n, F]``. ``n`` is k+1, or fewer where a
        schedule verifies fewer drafts (1: a step of the target's own, no drafts)."""


def pick_target_token(logits: Tensor, temperature: float, seed: Tensor, position: Tensor
                      ) -> Tensor:
    """The target's own token: argmax, or a Gumbel-max sample at the temperature (the draft
    step's own sampling, on a noise stream of its own)."""
    temperatures = torch.full(seed.shape, temperature, dtype=torch.float32, device=seed.device)
    return sample(logits, temperatures, seed, position, FIRST_TOKEN_STREAM)
