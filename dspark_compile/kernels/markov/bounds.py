"""The certified step's device functions and its pre-pass (the argument is
:mod:`dspark_compile.draft.certified`'s): before the walk, each tile's largest value and
its column; in a step, the least score (the best exact score of a request's candidates),
each tile's bound and each column's bound, which no score there exceeds."""

import triton
import triton.language as tl

from dspark_compile.kernels.markov.tiles import (_gumbel_fp32, _gumbel_scores, _mix,
                                                 _round_bf16, _row_inputs, _slack)


@triton.jit
def _tile_maxima_kernel(base_ptr, temperature_ptr, seed_ptr, position_ptr, norms_ptr,
                        top_ptr, size_ptr, norm_top_ptr, candidates_ptr, V, k, tiles,
                        base_stride, BLOCK: tl.constexpr, GROUP: tl.constexpr,
                        SEGMENT: tl.constexpr, C: tl.constexpr):
    # Program (request r, step j, GROUP tiles): each tile's largest value (U where r is
    # greedy, the fp32 estimate of U / T + G where it samples, -inf past the vocabulary)
    # and its largest |U|; the first request's first step also each tile's largest norm
    # of W2's rows. The group's best column goes into its segment's candidate (SEGMENT
    # groups a segment) by an atomic maximum of (value, -column), both in one int64.
    rj = tl.program_id(0)
    r, j = rj // k, rj % k
    rows = r + tl.arange(0, 1)
    t, hot, any_hot, key = _row_inputs(temperature_ptr, seed_ptr, position_ptr, rows,
                                       rows < r + 1)
    group = tl.program_id(1)
    tile = group * GROUP + tl.arange(0, GROUP)
    cols = tile[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    ok = cols < V
    u = tl.load(base_ptr + r * base_stride + j * V + cols, mask=ok, other=0.0).to(tl.float32)
    value = u
    if any_hot:
        h = _mix(_mix(key ^ j)[:, None] ^ cols.to(tl.uint32))
        value = u / t[:, None] + _gumbel_fp32(h)
    value = tl.where(ok, value, float("-inf"))
    top, column = tl.max(value, axis=1, return_indices=True,
                         return_indices_tie_break_left=True)
    live = tile < tiles
    tl.store(top_ptr + rj * tiles + tile, top, mask=live)
    tl.store(size_ptr + rj * tiles + tile, tl.max(tl.abs(u), axis=1), mask=live)
    if rj == 0:
        norms = tl.load(norms_ptr + cols, mask=ok, other=0.0)
        tl.store(norm_top_ptr + tile, tl.max(norms, axis=1), mask=live)
    best, at = tl.max(top, axis=0, return_indices=True, return_indices_tie_break_left=True)
    slots = tl.arange(0, GROUP)
    best_col = (group * GROUP + at) * BLOCK + tl.sum(tl.where(slots == at, column, 0), axis=0)
    bits = best.to(tl.int32, bitcast=True)  # ordered as the floats, negatives flipped
    bits = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    packed = (bits.to(tl.int64) << 32) | (0xFFFFFFFF - best_col.to(tl.int64))
    tl.atomic_max(candidates_ptr + rj * C + group // SEGMENT, packed)


@triton.jit
def _least(w2_ptr, base_row_ptr, candidates_ptr, e, t, hot, any_hot, row_key, rows, row_ok,
           R, step, k, RANK: tl.constexpr, R_PAD: tl.constexpr, BLOCK: tl.constexpr,
           C: tl.constexpr):
    # Each request's least score (+inf for padding rows, whose tiles then never pass): the
    # best exact score of its candidates (as the pre-pass packed them; a segment past the
    # vocabulary has none), laid in one tile's slots (request r in slots r C .. r C + C - 1)
    # and scored as the step scores a tile, the same product of the same shapes: the same
    # value the step meets at those columns.
    slots = tl.arange(0, BLOCK)
    owner = slots // C
    packed = tl.load(candidates_ptr + (owner * k + step) * C + slots % C, mask=owner < R,
                     other=-9223372036854775808)
    filled = packed != -9223372036854775808
    cols = tl.where(filled, 0xFFFFFFFF - (packed & 0xFFFFFFFF), 0).to(tl.int32)
    w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                 mask=filled[:, None], other=0.0)
    bias = _round_bf16(tl.dot(e, tl.trans(w2), out_dtype=tl.float32))
    base = tl.load(base_row_ptr[:, None] + cols[None, :],
                   mask=row_ok[:, None] & filled[None, :], other=0.0)
    mine = (rows[:, None] == owner[None, :]) & filled[None, :]
    # each request's own slots, [R_PAD, C]
    z = tl.sum(tl.reshape(tl.where(mine, _round_bf16(base.to(tl.float32) + bias), 0.0),
                          (R_PAD, R_PAD, C)), axis=1)
    own = tl.sum(tl.reshape(tl.where(mine, cols[None, :], 0), (R_PAD, R_PAD, C)), axis=1)
    real = tl.sum(tl.reshape(mine.to(tl.int32), (R_PAD, R_PAD, C)), axis=1) > 0
    least = tl.max(tl.where(real, z, float("-inf")), axis=1).to(tl.float64)
    if any_hot:
        sampled = _gumbel_scores(z, t[:, None], _mix(row_key[:, None] ^ own.to(tl.uint32)))
        least = tl.where(hot, tl.max(tl.where(real, sampled, float("-inf")), axis=1), least)
    return tl.where(row_ok, least, float("inf"))


@triton.jit
def _tile_bounds(top, size, norm_top, e_norm, t, hot, any_hot):
    # [R_PAD, tiles]: no score in a tile exceeds its bound. Greedy rows: the column bound of
    # the tile's largest U and largest norm, every operation monotone. Sampled rows: the
    # tile's largest U / T + G plus what the bias and its roundings add at most,
    # D = X + 2^-7 (|U| + X) over T, widened past the fp32 estimates' error.
    x = norm_top[None, :] * (e_norm * 1.0078125)[:, None]
    bound = _round_bf16(top + x)
    if any_hot:
        s = top + (x + 0.0078125 * (size + x)) / t[:, None]
        s += _slack(s) + 1e-5 * (30.0 + tl.abs(top) + (size + x) / t[:, None])
        bound = tl.where(hot[:, None], s, bound)
    return bound


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
