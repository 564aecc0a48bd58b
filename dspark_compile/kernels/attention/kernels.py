"""The two attention kernels: one chunk of keys per program, then the chunks merged in
order (see :mod:`dspark_compile.kernels.attention`)."""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e))


@triton.jit
def _visible_span(anchor_pos_ptr, r, ROWS: tl.constexpr, WINDOW: tl.constexpr):
    # The slots a request's block sees in this layer: [lo, hi). Positions fit in 32 bits;
    # 64-bit key indices would double the registers of every tile's offsets.
    s = tl.load(anchor_pos_ptr + r).to(tl.int32)
    lo = s * 0
    if WINDOW > 0:
        lo = tl.maximum(s - WINDOW, 0)
    return s, lo, s + ROWS


@triton.jit
def _query_rows(row_block, h, BLOCK_M: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr):
    # Row m of a kv head's program is block row m % ROWS of query head h * GROUP + m // ROWS
    m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    return m, m % ROWS, h * GROUP + m // ROWS, m < GROUP * ROWS


@triton.jit
def _attend_chunk_kernel(q_ptr, k_ptr, v_ptr, anchor_pos_ptr, acc_ptr, best_ptr, total_ptr,
                         q_stride_r, q_stride_n, q_stride_h,
                         k_stride_r, k_stride_h, k_stride_s,
                         v_stride_r, v_stride_h, v_stride_s,
                         KV_HEADS: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, WINDOW: tl.constexpr, CAUSAL: tl.constexpr,
                         SCALE: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS_PAD: tl.constexpr,
                         PRECISION: tl.constexpr):
    # Program (chunk, request x kv head, row block): online softmax over the chunk's
    # visible keys, in tiles of BLOCK_N from the chunk's start. Head dims have stride 1:
    # Triton then loads 16 bytes at a time and pipelines the tiles.
    chunk, pair, row_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r, h = (pair // KV_HEADS).to(tl.int64), pair % KV_HEADS
    s, lo, hi = _visible_span(anchor_pos_ptr, r, ROWS, WINDOW)
    start = tl.maximum(lo, chunk * CHUNK)
    end = tl.minimum(hi, (chunk + 1) * CHUNK)
    first = start - (start - chunk * CHUNK) % BLOCK_N
    tiles = tl.maximum(tl.cdiv(end - first, BLOCK_N), 0).to(tl.int32)  # 0: nothing seen
    m, i, head, row_ok = _query_rows(row_block, h, BLOCK_M, GROUP, ROWS)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + r * q_stride_r + i[:, None] * q_stride_n + head[:, None] * q_stride_h
                + d[None, :], mask=row_ok[:, None], other=0.0)
    k_rows = k_ptr + r * k_stride_r + h * k_stride_h + d[None, :]
    v_rows = v_ptr + r * v_stride_r + h * v_stride_h + d[None, :]
    best = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for tile in range(tiles):
        keys = first + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = (keys >= start) & (keys < end)
        k = tl.load(k_rows + keys[:, None] * k_stride_s, mask=key_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (SCALE * LOG2E)
        seen = key_ok[None, :]
        if CAUSAL:  # inside the block a row sees the slots up to its own
            seen = seen & ((keys[None, :] < s) | (keys[None, :] <= s + i[:, None]))
        scores = tl.where(seen, scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, 1))
        # a row that has seen nothing yet keeps max -inf: shift by 0 there, not by -inf
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)
        p = tl.math.exp2(scores - shift[:, None])
        alpha = tl.math.exp2(best - shift)
        v = tl.load(v_rows + keys[:, None] * v_stride_s, mask=key_ok[:, None], other=0.0)
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        best = new_best
    slot = (pair * CHUNKS + chunk) * ROWS_PAD + m
    written = tiles > 0
    tl.store(acc_ptr + slot[:, None] * HEAD_DIM + d[None, :], acc, mask=written)
    tl.store(best_ptr + slot, best, mask=written)
    tl.store(total_ptr + slot, total, mask=written)


@triton.jit
def _merge_chunks_kernel(acc_ptr, best_ptr, total_ptr, anchor_pos_ptr, out_ptr,
                         out_stride_r, out_stride_n, out_stride_h,
                         KV_HEADS: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, WINDOW: tl.constexpr, CHUNK: tl.constexpr,
                         CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_PAD: tl.constexpr):
    # Program (request x kv head, row block): the chunks that hold a visible key, in order
    pair, row_block = tl.program_id(0), tl.program_id(1)
    r, h = (pair // KV_HEADS).to(tl.int64), pair % KV_HEADS
    s, lo, hi = _visible_span(anchor_pos_ptr, r, ROWS, WINDOW)
    first, last = (lo // CHUNK).to(tl.int32), ((hi - 1) // CHUNK).to(tl.int32)
    m, i, head, row_ok = _query_rows(row_block, h, BLOCK_M, GROUP, ROWS)
    d = tl.arange(0, HEAD_DIM)
    slot = pair * CHUNKS * ROWS_PAD + m
    best = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for chunk in range(first, last + 1):
        best = tl.maximum(best, tl.load(best_ptr + slot + chunk * ROWS_PAD))
    total = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for chunk in range(first, last + 1):
        # every row sees its block's first slot, so best is finite; a chunk whose keys
        # a row cannot see has max -inf there and weighs 0
        weight = tl.math.exp2(tl.load(best_ptr + slot + chunk * ROWS_PAD) - best)
        total += tl.load(total_ptr + slot + chunk * ROWS_PAD) * weight
        part = tl.load(acc_ptr + (slot + chunk * ROWS_PAD)[:, None] * HEAD_DIM + d[None, :])
        acc += part * weight[:, None]
    out = acc / total[:, None]
    tl.store(out_ptr + r * out_stride_r + i[:, None] * out_stride_n
             + head[:, None] * out_stride_h + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
