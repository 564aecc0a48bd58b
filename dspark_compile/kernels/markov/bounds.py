"""The certified step's device functions (the argument is
:mod:`dspark_compile.draft.certified`'s): each column's bound, which no score of it
exceeds, and each row's least score, the exact score of the column whose bound is
highest, which the step's best reaches."""

import triton
import triton.language as tl

from dspark_compile.kernels.markov.tiles import (_gumbel_fp32, _gumbel_scores, _mix,
                                                 _round_bf16, _slack)


@triton.jit
def _bounds(base, norms, e_norm, t, hot, any_hot, row_key, cols, V):
    # round(U + ||W2[v]|| ||e|| (1 + 2^-7)) in fp32, every rounding monotone; sampled rows
    # add the noise, their fp32 estimate widened by _slack (-inf past the vocabulary)
    col_ok = cols < V
    bound = _round_bf16(base.to(tl.float32)
                        + norms[None, :] * (e_norm * 1.0078125)[:, None])
    if any_hot:
        h = _mix(row_key[:, None] ^ cols[None, :].to(tl.uint32))
        s = bound / t[:, None] + _gumbel_fp32(h)
        bound = tl.where(hot[:, None], s + _slack(s), bound)
    return tl.where(col_ok[None, :], bound, float("-inf"))


@triton.jit
def _seed_scores(w2_ptr, norms_ptr, least_ptr, barrier_ptr, base_row_ptr, e, e_norm, t, hot,
                 any_hot, row_key, rows, row_ok, program, V, RANK: tl.constexpr,
                 R_PAD: tl.constexpr, BLOCK: tl.constexpr, RUN: tl.constexpr,
                 PROGRAMS: tl.constexpr, PARTS: tl.constexpr, SPAN: tl.constexpr):
    # Each row's least score over every program (+inf for padding rows, which then read
    # nothing), and the rows of W2 this program read for it. Every program waits here
    # until all have published theirs.
    # SPAN tiles at a time (the last span may reach into the next run: any column's
    # bound and score serve), the base logits left in L2 for the step to read again
    seed_bound = tl.full((R_PAD,), float("-inf"), tl.float32)
    seed = tl.zeros((R_PAD,), tl.int32)
    for start in range(0, RUN * BLOCK, SPAN * BLOCK):
        first = program * RUN * BLOCK + start
        cols = first + tl.arange(0, SPAN * BLOCK)
        col_ok = cols < V
        base = tl.load(base_row_ptr[:, None] + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        norms = tl.load(norms_ptr + cols, mask=col_ok, other=0.0)
        bound = _bounds(base, norms, e_norm, t, hot, any_hot, row_key, cols, V)
        top, top_index = tl.max(bound, axis=1, return_indices=True,
                                return_indices_tie_break_left=True)
        better = top > seed_bound
        seed_bound = tl.where(better, top, seed_bound)
        seed = tl.where(better, top_index + first, seed)
    # the rows' seed columns in the first slots of one tile, scored as the step scores a
    # tile (the same product of the same shapes: the same value the step meets there)
    slots = tl.arange(0, BLOCK)
    mine = rows[:, None] == slots[None, :]
    cols = tl.sum(tl.where(mine, seed[:, None], 0), axis=0)
    filled = tl.sum((mine & row_ok[:, None]).to(tl.int32), axis=0) > 0
    w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                 mask=filled[:, None], other=0.0)
    bias = _round_bf16(tl.dot(e, tl.trans(w2), out_dtype=tl.float32))
    base = tl.load(base_row_ptr[:, None] + cols[None, :],
                   mask=row_ok[:, None] & filled[None, :], other=0.0)
    z = tl.max(tl.where(mine, _round_bf16(base.to(tl.float32) + bias), float("-inf")), axis=1)
    least = z.to(tl.float64)
    if any_hot:
        sampled = _gumbel_scores(z, t, _mix(row_key ^ seed.to(tl.uint32)))
        least = tl.where(hot, sampled, least)
    tl.store(least_ptr + rows * PROGRAMS + program, least)
    # a grid barrier, as the resident walk's
    tl.debug_barrier()
    tl.atomic_add(barrier_ptr, 1, sem="release")
    arrived = False
    while not arrived:
        arrived = tl.atomic_add(barrier_ptr, 0, sem="acquire") == PROGRAMS
    least = tl.full((R_PAD,), float("-inf"), tl.float64)
    for start in range(0, PROGRAMS, PARTS):
        parts = start + tl.arange(0, PARTS)
        part = tl.load(least_ptr + rows[:, None] * PROGRAMS + parts[None, :],
                       mask=(parts < PROGRAMS)[None, :] & row_ok[:, None],
                       other=float("-inf"), cache_modifier=".cg")
        least = tl.maximum(least, tl.max(part, axis=1))
    return tl.where(row_ok, least, float("inf")), tl.sum(filled.to(tl.int32), axis=0)
