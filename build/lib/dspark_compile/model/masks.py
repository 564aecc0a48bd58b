"""Which cache slots each block row sees, per layer type (speculators' DFlash rules).

A block at anchor position ``s`` has its rows' keys in slots ``s .. s+n-1``, behind the
context slots ``0 .. s-1``. A ``full_attention`` layer sees every context slot and the
whole block (bidirectional). A ``sliding_attention`` layer sees the ``sliding_window``
context positions before the anchor (``s-W .. s-1``: the window is measured from the
anchor, not from each row) and the block, causally when the lane says ``sliding_causal``.
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from dspark_compile.config import LaneConfig

FLEX_BLOCK = 128  # keys (and query rows) per block of a FlexAttention block mask
Mask = Union[Tensor, BlockMask]


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
    """One mask per layer type the lane uses, over the ``group*rows`` query rows of a kv
    head (row ``g*rows + i`` is block row i): a FlexAttention block mask with
    ``flex_attention`` on CUDA, else ``[R, 1, group*rows, slots]`` bool for SDPA."""
    n = lane.block_rows
    queries = lane.num_heads // lane.num_kv_heads * n
    masks: dict[str, Mask] = {}
    for kind in sorted({lane.layer_type(i) for i in range(lane.num_layers)}):
        sliding = kind == "sliding_attention"
        if lane.flex_attention and anchor_pos.is_cuda:
            masks[kind] = flex_block_mask(lane, sliding, anchor_pos, queries, slots)
            continue
        device = anchor_pos.device
        key = torch.arange(slots, device=device)[None, None, :]           # [1, 1, S]
        row = torch.arange(n, device=device)[None, :, None]               # [1, n, 1]
        seen = visible(lane, sliding, anchor_pos[:, None, None], row, key).expand(-1, n, -1)
        masks[kind] = seen.repeat(1, queries // n, 1)[:, None]
    return masks


def flex_block_mask(lane: LaneConfig, sliding: bool, anchor_pos: Tensor, queries: int,
                    slots: int) -> BlockMask:
    """The key blocks each request can see (context and block, inside its window),
    every one listed as partial, so the kernel applies :func:`visible` to all of them.

    Listing fully visible blocks apart would let the decoding kernel split the keys
    by the cache's length, and the result's last bits would then depend on how many
    empty slots follow the context (the host path's cache is shorter than a runner's).
    """
    n, size = lane.block_rows, FLEX_BLOCK
    device = anchor_pos.device
    lo = torch.zeros_like(anchor_pos)
    if sliding:
        lo = (anchor_pos - lane.sliding_window).clamp(min=0)
    first = lo // size
    count = (anchor_pos + n - 1) // size - first + 1   # anchor_pos + n <= slots - 1
    blocks, query_blocks = -(-slots // size), -(-queries // size)
    indices = (first[:, None] + torch.arange(blocks, device=device)).clamp(max=blocks - 1)
    shape = (anchor_pos.shape[0], 1, query_blocks)

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, key: Tensor) -> Tensor:
        return visible(lane, sliding, anchor_pos[b], q % n, key)
    return BlockMask.from_kv_blocks(
        count.to(torch.int32)[:, None, None].expand(shape).contiguous(),
        indices.to(torch.int32)[:, None, None].expand(*shape, blocks).contiguous(),
        BLOCK_SIZE=size, mask_mod=mask_mod, seq_lengths=(queries, slots))
