"""Which cache slots each block row sees, per layer type (speculators' DFlash rules).

A block at anchor position ``s`` has its rows' keys in slots ``s .. s+n-1``, behind the
context slots ``0 .. s-1``. A ``full_attention`` layer sees every context slot and the
whole block (bidirectional). A ``sliding_attention`` layer sees the ``sliding_window``
context positions before the anchor (``s-W .. s-1``: the window is measured from the
anchor, not from each row) and the block, causally when the lane says ``sliding_causal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from dspark_compile.config import LaneConfig
from dspark_compile.kernels import runs_on


@dataclass(frozen=True)
class Span:
    """A layer type's mask as :func:`dspark_compile.kernels.attention.block_attention`
    takes it: the anchor positions, the window (0: none) and whether the block is causal."""

    anchor_pos: Tensor
    window: int
    causal: bool


Mask = Union[Tensor, Span]


def visible(lane: LaneConfig, sliding: bool, start: Tensor, row: Tensor, key: Tensor) -> Tensor:
    """Whether block row ``row`` of a block at position ``start`` sees cache slot ``key``
    (broadcasting) in a layer of the given type."""
    seen = key < start + lane.block_rows                                  # context + block
    if sliding:
        seen = seen & (key >= start - lane.sliding_window)
        if lane.sliding_causal:
            seen = seen & ((key < start) | (key <= start + row))
    return seen


def attention_masks(lane: LaneConfig, anchor_pos: Tensor, slots: int) -> dict[str, Mask]:
    """One mask per layer type the lane uses: a :class:`Span` where the lane attends with
    the fused kernel (``fused_attention``, on CUDA), else ``[R, 1, group*rows, slots]``
    bool for SDPA over the ``group*rows`` query rows of a kv head (row ``g*rows + i`` is
    block row i)."""
    n = lane.block_rows
    queries = lane.num_heads // lane.num_kv_heads * n
    masks: dict[str, Mask] = {}
    for kind in sorted({lane.layer_type(i) for i in range(lane.num_layers)}):
        sliding = kind == "sliding_attention"
        if lane.fused_attention and runs_on(anchor_pos.device):
            masks[kind] = Span(anchor_pos, lane.sliding_window if sliding else 0,
                               sliding and lane.sliding_causal)
            continue
        device = anchor_pos.device
        key = torch.arange(slots, device=device)[None, None, :]           # [1, 1, S]
        row = torch.arange(n, device=device)[None, :, None]               # [1, n, 1]
        seen = visible(lane, sliding, anchor_pos[:, None, None], row, key).expand(-1, n, -1)
        masks[kind] = seen.repeat(1, queries // n, 1)[:, None]
    return masks
