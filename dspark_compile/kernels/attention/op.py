"""The op ``dspark::block_attention``, registered on import (see the package docstring):
imported by :func:`dspark_compile.kernels.register` only, where the kernels can run."""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from dspark_compile.kernels import attention
from dspark_compile.kernels.attention.kernels import _attend_chunk_kernel, _merge_chunks_kernel


@torch.library.triton_op("dspark::block_attention", mutates_args=())
def block_attention(q: Tensor, k: Tensor, v: Tensor, anchor_pos: Tensor, window: int,
                    causal: bool, scale: float) -> Tensor:
    R, n, heads, head_dim = q.shape
    kv_heads, slots = k.shape[1], k.shape[2]
    rows = heads // kv_heads * n
    shape = attention.launch_shape(rows, head_dim)
    chunks, row_blocks = triton.cdiv(slots, shape.chunk), triton.cdiv(rows, shape.block_m)
    partial = (R * kv_heads, chunks, row_blocks * shape.block_m)
    acc = torch.empty(*partial, head_dim, dtype=torch.float32, device=q.device)
    best = torch.empty(partial, dtype=torch.float32, device=q.device)
    total = torch.empty(partial, dtype=torch.float32, device=q.device)
    out = torch.empty(R, n, heads, head_dim, dtype=q.dtype, device=q.device)
    # the kernels take every stride but the head dim's, which must be 1
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    anchor_pos = anchor_pos.contiguous()
    lane = dict(KV_HEADS=kv_heads, GROUP=heads // kv_heads, ROWS=n, HEAD_DIM=head_dim,
                WINDOW=window, CHUNK=shape.chunk, CHUNKS=chunks, ROWS_PAD=partial[2],
                num_warps=shape.warps)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 lanes: exact products
    torch.library.wrap_triton(_attend_chunk_kernel)[(chunks, R * kv_heads, row_blocks)](
        q, k, v, anchor_pos, acc, best, total, *strides, CAUSAL=causal, SCALE=scale,
        BLOCK_M=shape.block_m, BLOCK_N=shape.block_n, PRECISION=precision,
        num_stages=shape.stages, **lane)
    merge_rows = min(attention.MERGE_ROWS, shape.block_m)  # divides ROWS_PAD
    torch.library.wrap_triton(_merge_chunks_kernel)[
        (R * kv_heads, partial[2] // merge_rows)](
        acc, best, total, anchor_pos, out, *out.stride()[:3], BLOCK_M=merge_rows, **lane)
    return out
