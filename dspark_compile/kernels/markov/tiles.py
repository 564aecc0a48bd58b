"""The Triton device functions both Markov kernels share: bf16 rounding, the counter-based
noise, one tile's logits, the sampled rows' running best, publishing and reducing the
programs' bests."""

import triton
import triton.language as tl


@triton.jit
def _round_bf16(x):
    # fp32 -> nearest bf16 (ties to even), kept in fp32, as draft.sampling.rounded rounds: one
    # cvt.rn.bf16x2 per two values (Triton keeps the round trip that Inductor dropped),
    # where the integer bit trick took four instructions a value
    return x.to(tl.bfloat16).to(tl.float32)

@triton.jit
def _mix(x):
    # rng._mix on uint32: the same avalanche, the products wrapping at 2^32
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x5BD1E995
    return x ^ (x >> 16)

@triton.jit
def _gumbel_scores(z, t, h):
    # z / T + G in float64 for hash values h, as draft.sampling.gumbel_scores computes it (rng.gumbel)
    u = (h.to(tl.float64) + 0.5) / 4294967296.0
    return z.to(tl.float64) / t.to(tl.float64) - tl.log(-tl.log(u))

@triton.jit
def _gumbel_fp32(h):
    # G = -log(-log(u)) in fp32 within 1e-5 of float64 (u = (h + 0.5) / 2^32): -log(u)
    # comes from 1 - u, kept exact, where u is near 1 and fp32 cannot tell u from 1
    d = ((h ^ 0xFFFFFFFF).to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 1 - u
    series = d * (1.0 + d * (0.5 + d * (0.3333333432674408 + d * 0.25)))
    u = (h.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    return -tl.log(tl.where(d < 0.015625, series, -tl.log(u)))

@triton.jit
def _slack(s):
    # how far an fp32 estimate of a score may be from its float64 value, ten times over
    return 2e-4 + 1e-5 * tl.abs(s)

@triton.jit
def _first_max_and_second(a, a_index, a_z, a_second, b, b_index, b_z, b_second):
    # tl.reduce's combine: the maximum (the lowest index winning ties) with its index and
    # z, and the largest value besides it
    a_wins = (a > b) | ((a == b) & (a_index < b_index))
    second = tl.maximum(tl.maximum(a_second, b_second), tl.minimum(a, b))
    return (tl.where(a_wins, a, b), tl.where(a_wins, a_index, b_index),
            tl.where(a_wins, a_z, b_z), second)

@triton.jit
def _base_tile(base_row_ptr, tile, V, row_ok, BLOCK: tl.constexpr):
    # the step's base logits of one tile's columns, read once: first out of L2, which then
    # keeps more of the W2 tiles that the next step reads first
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    return tl.load(base_row_ptr[:, None] + cols[None, :],
                   mask=row_ok[:, None] & (cols < V)[None, :], other=0.0,
                   eviction_policy="evict_first")

@triton.jit
def _tile_values(bias, base, tile, V, BLOCK: tl.constexpr):
    # the step's bf16 logits z of one tile, exact in fp32 (-inf past the vocabulary)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    z = _round_bf16(base.to(tl.float32) + bias)
    return tl.where((cols < V)[None, :], z, float("-inf"))

@triton.jit
def _sampled_update(best, index, z, tile, V, t, hot, any_hot, row_key,
                    BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    # The running (best score in float64, its first column) of each sampled request,
    # updated with one tile's values z; a tie keeps the lower column (the new one where
    # tiles come REVERSE, backwards).
    columns = tl.arange(0, BLOCK)
    cols = tile * BLOCK + columns
    col_ok = cols < V
    if any_hot:  # greedy batches skip the noise
        # The float64 score z / T + G of a column costs two float64 logs. An fp32
        # estimate of every column's score (error below 2e-5 + 2e-7 |score|, a tenth of
        # _slack) says in one pass which column leads the tile, whether another is close
        # enough to contend, and whether the tile can beat the run's best at all; only
        # where it can is the leader scored in float64, or, where two contend (near-ties,
        # exact ties), every column of the tile.
        h = _mix(row_key[:, None] ^ cols[None, :].to(tl.uint32))
        estimate = tl.where(col_ok[None, :], z / t[:, None] + _gumbel_fp32(h),
                            float("-inf"))
        lead, lead_index, lead_z, second = tl.reduce(
            (estimate, tl.broadcast_to(columns[None, :], estimate.shape), z,
             tl.full(estimate.shape, float("-inf"), tl.float32)), 1, _first_max_and_second)
        can_win = hot & (lead + _slack(lead) >= best.to(tl.float32))
        if tl.max(can_win.to(tl.int32), axis=0) > 0:
            contended = can_win & (second + _slack(second) >= lead - _slack(lead))
            if tl.max(contended.to(tl.int32), axis=0) > 0:
                exact = tl.where(col_ok[None, :], _gumbel_scores(z, t[:, None], h),
                                 float("-inf"))
                hot_best, hot_index = tl.max(exact, axis=1, return_indices=True,
                                             return_indices_tie_break_left=True)
            else:
                hot_index = lead_index
                hot_best = _gumbel_scores(
                    lead_z, t, _mix(row_key ^ (tile * BLOCK + lead_index).to(tl.uint32)))
            better = can_win & ((hot_best >= best) if REVERSE else (hot_best > best))
            best = tl.where(better, hot_best, best)
            index = tl.where(better, hot_index + tile * BLOCK, index)
    return best, index

@triton.jit
def _merge(hot, best, index, greedy, greedy_index):
    # each request's (score in float64, first column): sampled rows' or greedy rows'
    return tl.where(hot, best, greedy.to(tl.float64)), tl.where(hot, index, greedy_index)

@triton.jit
def _row_inputs(temperature_ptr, seed_ptr, position_ptr, rows, row_ok):
    # per request: T where it samples (1 elsewhere), whether it samples, whether any row
    # does, and the key of its noise before the step is mixed in (rng.gumbel's keys)
    temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=0.0)
    hot = temperature > 0
    key = _mix(tl.load(seed_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
    key = _mix(key ^ tl.load(position_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
    return (tl.where(hot, temperature, 1.0), hot,
            tl.max(hot.to(tl.int32), axis=0) > 0, key)

@triton.jit
def _publish(best, index, best_ptr, index_ptr, rows, program, PROGRAMS: tl.constexpr):
    # this program's bests where the others read them; every padded row has its slot:
    # no mask, and no row predicate kept for the whole run (ptxas would spill it)
    tl.store(best_ptr + rows * PROGRAMS + program, best)
    tl.store(index_ptr + rows * PROGRAMS + program, index)

@triton.jit
def _reduce(best_ptr, index_ptr, d2t_ptr, rows, R, V, PROGRAMS: tl.constexpr,
            PARTS: tl.constexpr, HAS_D2T: tl.constexpr):
    # every program's published bests -> the step's target ids, the lowest column
    # winning ties
    final_best = tl.full(rows.shape, float("-inf"), tl.float64)
    final_index = tl.zeros(rows.shape, tl.int32)
    for start in range(0, PROGRAMS, PARTS):  # most often all at once
        parts = start + tl.arange(0, PARTS)
        # the requests' rows only (in the resident walk every program reads them, from
        # the same lines of L2, at once)
        ok = (parts < PROGRAMS)[None, :] & (rows < R)[:, None]
        offsets = rows[:, None] * PROGRAMS + parts[None, :]
        # .cg: read at L2, where the other programs' stores are, not a stale L1
        part_best = tl.load(best_ptr + offsets, mask=ok, other=float("-inf"),
                            cache_modifier=".cg")
        part_index = tl.load(index_ptr + offsets, mask=ok, other=0, cache_modifier=".cg")
        chunk_best = tl.max(part_best, axis=1)
        chunk_index = tl.min(tl.where(part_best == chunk_best[:, None], part_index, V),
                             axis=1)
        better = chunk_best > final_best
        final_best = tl.where(better, chunk_best, final_best)
        final_index = tl.where(better, chunk_index, final_index)
    draft = final_index.to(tl.int64)
    if HAS_D2T:
        draft += tl.load(d2t_ptr + draft, mask=rows < R, other=0)
    return draft
