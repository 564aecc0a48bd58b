"""The block's attention over the KV cache in Triton: the op ``dspark::block_attention``.

A round's block (9-16 rows a request, times the query heads of each kv head) attends over
every cache slot its request can see: the context (or, in a sliding layer, the
``window`` positions before the anchor) and the block's own slots, causally inside the
block where the layer says so. So few query rows leave a GPU idle unless the keys are
split: the first kernel gives each program one chunk of ``chunk`` keys of one request and
kv head (and a block of query rows) and writes that chunk's running max, sum and
unnormalised output in fp32; the second merges a request's chunks in key order.

The chunks are fixed spans of absolute cache slots, and the merge visits only the
chunks that hold a visible key, in order. So a request's result depends on its own query
rows, keys and anchor position alone: not on the batch it is drafted in, nor on how many
slots the cache has. Every path (the host path, the eager device path, ``inductor``,
``aoti``) runs this op with the same launch, so they share its bits; the test against a
float64 recomputation checks what it computes.

``torch.library.triton_op`` lets ``torch.compile``, ``torch.export`` and AOTInductor keep
the kernels inside their graphs. Off CUDA, lanes attend with SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark_compile.kernels import register


# query rows per program of the merge: a row's merge is a few loads per chunk, so at
# batch 1 the 64-row blocks of the first kernel left it 8 programs, latency-bound; a row's
# bits do not depend on which program merges it
MERGE_ROWS = 16


@dataclass(frozen=True)
class Launch:
    """``chunk`` keys per program of the first kernel, ``block_m`` query rows and
    ``block_n`` keys per tile, ``warps`` and ``stages`` (Triton's pipeline depth) per
    program. The chunk sets the bits (the order of the sums): it depends on the lane's
    shapes only."""

    chunk: int
    block_m: int
    block_n: int
    warps: int
    stages: int


def launch_shape(rows: int, head_dim: int) -> Launch:
    """The launch for ``rows`` query rows per kv head (query heads per kv head x block
    rows) of ``head_dim``: as many rows per program as keep the fp32 accumulator at 8,192
    values, and at head_dim 256 twice the warps, one stage less and chunks of 256 keys, so
    that neither real lane's kernel spills registers on sm_90 (``tests/kernels``); chunks
    of 512 keys below (fewer partial results to merge: the fastest of the launches timed
    at every batch of the 27B lane)."""
    block_m = min(max(16, 1 << (rows - 1).bit_length()), max(16, 8192 // head_dim))
    wide = head_dim > 128
    return Launch(chunk=256 if wide else 512, block_m=block_m, block_n=64,
                  warps=8 if wide else 4, stages=2 if wide else 3)


def block_attention(q: Tensor, k: Tensor, v: Tensor, anchor_pos: Tensor, window: int,
                    causal: bool, scale: float) -> Tensor:
    """Attention of the block rows ``q [R, n, heads, head_dim]`` over the cache's keys
    and values ``k, v [R, kv_heads, slots, head_dim]`` (block row i at slot anchor_pos + i):
    every slot before ``anchor_pos + n``, from ``anchor_pos - window`` on where ``window``
    > 0, and inside the block only slots up to the row's own where ``causal``. Returns
    ``[R, n, heads, head_dim]`` in q's dtype."""
    register()
    return torch.ops.dspark.block_attention(q, k, v, anchor_pos, window, causal, scale)
