"""What a draft round takes and gives: the KV cache, the round's inputs, its outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from dspark_compile.config import LaneConfig


@dataclass
class KVCache:
    """Context keys and values ``[R, layers, kv_heads, slots, head_dim]``; slot = position.

    Requests are the outer dimension, so the first b rows of a cache are a contiguous cache
    of batch b (what a bucket of a compiled draft step takes).
    """

    k: Tensor
    v: Tensor

    @classmethod
    def allocate(cls, lane: LaneConfig, batch: int, device: torch.device | str,
                 max_context: Optional[int] = None) -> "KVCache":
        # the context, the block's scratch rows, one trash slot for padding rows
        slots = (max_context or lane.max_context) + lane.block_rows + 1
        shape = (batch, lane.num_layers, lane.num_kv_heads, slots, lane.head_dim)
        # zeros, not empty: masked slots still enter the attention product, so no NaN there
        return cls(*(torch.zeros(shape, dtype=lane.torch_dtype, device=device) for _ in "kv"))

    def clone(self) -> "KVCache":
        return KVCache(self.k.clone(), self.v.clone())


def greedy_defaults(requests: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """The temperature and seed of a round that leaves them out: zeros (greedy, seed 0)."""
    return (torch.zeros(requests, dtype=torch.float32, device=device),
            torch.zeros(requests, dtype=torch.long, device=device))


@dataclass
class RoundInputs:
    """What the target hands the drafter each round.

    features:    ``[R, N, F]`` tapped target hidden states for positions s-n .. s-1 (rows
                 past ``num_new`` are padding; the first round carries the prompt)
    num_new:     ``[R]`` int64, valid rows of ``features``
    anchor:      ``[R]`` int64, the last token the target produced (target vocabulary)
    anchor_pos:  ``[R]`` int64, its position s
    temperature: ``[R]`` float32, 0 drafts greedily (the default)
    seed:        ``[R]`` int64 in [0, 2^32), keys the sampling noise (default 0)
    """

    features: Tensor
    num_new: Tensor
    anchor: Tensor
    anchor_pos: Tensor
    temperature: Optional[Tensor] = None
    seed: Optional[Tensor] = None

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """All six inputs, the defaults filled in."""
        temperature, seed = self.temperature, self.seed
        if temperature is None or seed is None:
            default_t, default_seed = greedy_defaults(self.anchor.shape[0], self.anchor.device)
            temperature = default_t if temperature is None else temperature
            seed = default_seed if seed is None else seed
        return self.features, self.num_new, self.anchor, self.anchor_pos, temperature, seed


@dataclass
class DraftOutput:
    ids: Tensor          # [R, k] int64, target vocabulary
    confidences: Optional[Tensor]  # [R, k] float32; None for a drafter without the head
    probs: Optional[Tensor] = None  # [R, k, V_target] float32 draft distribution q
    # [R] int64 drafts to verify (0 .. k), from a runner that schedules (Runner.schedule)
    lengths: Optional[Tensor] = None

    def select(self, rows: Tensor) -> "DraftOutput":
        return DraftOutput(*(None if t is None else t[rows]
                             for t in (self.ids, self.confidences, self.probs, self.lengths)))
