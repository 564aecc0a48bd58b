"""The two Markov kernels: one launch per step streaming W2, or one launch for the whole
walk with W2 resident in shared memory (see :mod:`dspark_compile.kernels.markov`)."""

import triton
import triton.language as tl

from dspark_compile.kernels.markov.bounds import _bounds, _least, _tile_bounds
from dspark_compile.kernels.markov.tiles import (_base_tile, _merge, _mix, _publish, _reduce,
                                                 _round_bf16, _row_inputs, _sampled_update,
                                                 _tile_values)


@triton.jit
def _run_tile(program, nth, RUN: tl.constexpr, REVERSE: tl.constexpr):
    # the nth tile of a program's run
    return program * RUN + ((RUN - 1 - nth) if REVERSE else nth)

@triton.jit
def _update(z, tile, top, top_col, best, index, V, t, hot, any_hot, row_key,
            BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    # a tile's logits into the running bests; a tie keeps the lower column: the earlier
    # tile, or the later one backwards
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    ahead = (z >= top) if REVERSE else (z > top)
    top = tl.where(ahead, z, top)
    top_col = tl.where(ahead, cols[None, :], top_col)
    best, index = _sampled_update(best, index, z, tile, V, t, hot, any_hot, row_key,
                                  BLOCK, REVERSE)
    return top, top_col, best, index

@triton.jit
def _stream(w2_ptr, base_row_ptr, e, program, V, t, hot, any_hot, row_key, row_ok, top,
            top_col, best, index, count, RANK: tl.constexpr, BLOCK: tl.constexpr,
            RUN: tl.constexpr, REVERSE: tl.constexpr):
    # the first count tiles of the program's run (RUN, or none), W2 streamed. The base
    # tile is loaded one tile ahead: Triton's pipeline prefetches only the loads that feed
    # tl.dot, and this one would otherwise stall every tile.
    next_base = _base_tile(base_row_ptr, _run_tile(program, 0, RUN, REVERSE), V,
                           row_ok & (count > 0), BLOCK)
    for nth in range(count):  # any tile past the vocabulary is all masked
        tile = _run_tile(program, nth, RUN, REVERSE)
        base = next_base
        next_base = _base_tile(base_row_ptr, _run_tile(program, nth + 1, RUN, REVERSE), V,
                               row_ok & (nth + 1 < count), BLOCK)
        cols = tile * BLOCK + tl.arange(0, BLOCK)
        w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                     mask=(cols < V)[:, None], other=0.0)
        bias = _round_bf16(tl.dot(e, tl.trans(w2), out_dtype=tl.float32))
        top, top_col, best, index = _update(_tile_values(bias, base, tile, V, BLOCK), tile,
                                            top, top_col, best, index, V, t, hot, any_hot,
                                            row_key, BLOCK, REVERSE)
    return top, top_col, best, index

@triton.jit
def _contended(w2_ptr, base_row_ptr, norms_ptr, e, e_norm, least, passing, program, V, t,
               hot, any_hot, row_key, row_ok, top, top_col, best, index, RANK: tl.constexpr,
               BLOCK: tl.constexpr, RUN: tl.constexpr, REVERSE: tl.constexpr):
    # only the run's tiles that pass (the bits of passing), and of those only the columns
    # whose bound reaches the least score (a column below it can neither win nor tie); the
    # rows of W2 read
    read = tl.sum(tl.zeros((1,), tl.int32), axis=0)
    for nth in range(RUN):
        if (passing >> nth) & 1:
            tile = _run_tile(program, nth, RUN, REVERSE)
            cols = tile * BLOCK + tl.arange(0, BLOCK)
            base = _base_tile(base_row_ptr, tile, V, row_ok, BLOCK)
            norms = tl.load(norms_ptr + cols, mask=cols < V, other=0.0)
            contender = _bounds(base, norms, e_norm, t, hot, any_hot, row_key, cols,
                                V) >= least[:, None]
            wanted = (tl.max(contender.to(tl.int32), axis=0) > 0) & (cols < V)
            read += tl.sum(wanted.to(tl.int32), axis=0)
            w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                         mask=wanted[:, None], other=0.0)
            bias = _round_bf16(tl.dot(e, tl.trans(w2), out_dtype=tl.float32))
            z = tl.where(contender, _tile_values(bias, base, tile, V, BLOCK), float("-inf"))
            top, top_col, best, index = _update(z, tile, top, top_col, best, index, V, t,
                                                hot, any_hot, row_key, BLOCK, REVERSE)
    return top, top_col, best, index, read

@triton.jit
def _markov_step_kernel(w1_ptr, w2_ptr, base_ptr, anchor_ptr, temperature_ptr, seed_ptr,
                        position_ptr, d2t_ptr, best_ptr, index_ptr, count_ptr, ids_ptr,
                        R, V, k, base_stride, step, norms_ptr, candidates_ptr, top_ptr,
                        size_ptr, norm_top_ptr, tiles, read_ptr, RANK: tl.constexpr,
                        R_PAD: tl.constexpr, BLOCK: tl.constexpr, RUN: tl.constexpr,
                        PROGRAMS: tl.constexpr, PARTS: tl.constexpr,
                        HAS_D2T: tl.constexpr, REVERSE: tl.constexpr,
                        CERTIFIED: tl.constexpr, C: tl.constexpr, RUN_PAD: tl.constexpr):
    # One step: this program's run of RUN tiles of W2, streamed in column order or, with
    # REVERSE (every other step), backwards: a step then starts on the tiles the last one
    # ended with, which are still in L2. CERTIFIED (see bounds.py): first each request's
    # least score, from its C candidates, and the bounds of the run's tiles (from the
    # pre-pass's tile maxima); where at most 3 in 4 tiles can reach a least score, only
    # those are read, and in them only the columns whose bound reaches it; else the whole
    # run, as the full walk reads it. read_ptr counts the rows of W2 read.
    program = tl.program_id(0)
    rows = tl.arange(0, R_PAD)
    row_ok = rows < R
    # prev: the anchor at step 0, else the id the previous launch wrote
    prev = tl.load(anchor_ptr + rows, mask=row_ok & (step == 0), other=0)
    prev += tl.load(ids_ptr + rows * k + step - 1, mask=row_ok & (step > 0), other=0)
    t, hot, any_hot, key = _row_inputs(temperature_ptr, seed_ptr, position_ptr, rows,
                                       row_ok)
    # W1[prev], once per program: every tile multiplies it
    e = tl.load(w1_ptr + prev[:, None] * RANK + tl.arange(0, RANK)[None, :],
                mask=row_ok[:, None], other=0.0)
    base_row_ptr = base_ptr + rows * base_stride + step * V
    row_key = _mix(key ^ step)
    best = tl.full((R_PAD,), float("-inf"), tl.float64)
    index = tl.zeros((R_PAD,), tl.int32)
    # Greedy rows keep, in each of the BLOCK column slots, the best value and its first
    # column: elementwise per tile, reduced across the slots once, after the run.
    top = tl.full((R_PAD, BLOCK), float("-inf"), tl.float32)
    top_col = tl.zeros((R_PAD, BLOCK), tl.int32)
    if CERTIFIED:
        e_norm = tl.sqrt(tl.sum(e.to(tl.float32) * e.to(tl.float32), axis=1))
        least = _least(w2_ptr, base_row_ptr, candidates_ptr, e, t, hot, any_hot, row_key,
                       rows, row_ok, R, step, k, RANK, R_PAD, BLOCK, C)
        nths = tl.arange(0, RUN_PAD)
        run_tiles = _run_tile(program, nths, RUN, REVERSE)
        tile_ok = (nths < RUN) & (run_tiles * BLOCK < V)
        at = (rows[:, None] * k + step) * tiles + run_tiles[None, :]
        live = row_ok[:, None] & tile_ok[None, :]
        bound = _tile_bounds(tl.load(top_ptr + at, mask=live, other=float("-inf")),
                             tl.load(size_ptr + at, mask=live, other=0.0),
                             tl.load(norm_top_ptr + run_tiles, mask=tile_ok, other=0.0),
                             e_norm, t, hot, any_hot)
        passes = tl.max(((bound >= least[:, None]) & live).to(tl.int64), axis=0)
        # dense where streaming the whole run costs about what the passing tiles' latencies
        # do; both loops at the top level, where Triton's pipeline applies (none in a branch)
        dense = tl.sum(passes, axis=0) * 4 > RUN * 3
        top, top_col, best, index = _stream(w2_ptr, base_row_ptr, e, program, V, t, hot,
                                            any_hot, row_key, row_ok, top, top_col, best,
                                            index, tl.where(dense, RUN, 0), RANK, BLOCK, RUN,
                                            REVERSE)
        top, top_col, best, index, read = _contended(
            w2_ptr, base_row_ptr, norms_ptr, e, e_norm, least,
            tl.where(dense, 0, tl.sum(passes << nths.to(tl.int64), axis=0)), program, V, t,
            hot, any_hot, row_key, row_ok, top, top_col, best, index, RANK, BLOCK, RUN,
            REVERSE)
        read = tl.where(dense, tl.minimum(tl.maximum(V - program * RUN * BLOCK, 0),
                                          RUN * BLOCK), read)
        # the candidates' rows counted once, by the first program
        tl.atomic_add(read_ptr + step, read + tl.where(program == 0, R * C, 0))
    else:
        top, top_col, best, index = _stream(w2_ptr, base_row_ptr, e, program, V, t, hot,
                                            any_hot, row_key, row_ok, top, top_col, best,
                                            index, RUN, RANK, BLOCK, RUN, REVERSE)
    greedy = tl.max(top, axis=1)
    best, index = _merge(hot, best, index, greedy,
                         tl.min(tl.where(top == greedy[:, None], top_col, V), axis=1))
    _publish(best, index, best_ptr, index_ptr, rows, program, PROGRAMS)
    # The last program to count itself reduces the step (the pattern of Inductor's grid
    # barrier: a CTA barrier, then a release / acquire atomic).
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + step, 1, sem="acq_rel") == PROGRAMS - 1:
        tl.debug_barrier()
        draft = _reduce(best_ptr, index_ptr, d2t_ptr, rows, R, V, PROGRAMS, PARTS, HAS_D2T)
        tl.store(ids_ptr + rows * k + step, draft, mask=rows < R)

@triton.jit
def _markov_walk_kernel(w1_ptr, w2_ptr, base_ptr, anchor_ptr, temperature_ptr, seed_ptr,
                        position_ptr, d2t_ptr, best_ptr, index_ptr, count_ptr, ids_ptr,
                        R: tl.constexpr, V, base_stride, K: tl.constexpr,
                        RANK: tl.constexpr, R_PAD: tl.constexpr, BLOCK: tl.constexpr,
                        PROGRAMS: tl.constexpr, PARTS: tl.constexpr,
                        HAS_D2T: tl.constexpr):
    # All K steps: this program's BLOCK columns of W2 are read once and stay on chip;
    # between steps every program waits for all to publish their bests. Every program
    # must be resident at once (PROGRAMS <= multiprocessors). R is a compile-time
    # constant here, one kernel per batch, so that the row masks fold away and the
    # reduction loads only the requests' rows: every program reads them from the same
    # lines of L2 each step.
    program = tl.program_id(0)
    rows = tl.arange(0, R_PAD)
    row_ok = rows < R
    t, hot, any_hot, key = _row_inputs(temperature_ptr, seed_ptr, position_ptr, rows,
                                       row_ok)
    cols = program * BLOCK + tl.arange(0, BLOCK)
    w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                 mask=(cols < V)[:, None], other=0.0)
    prev = tl.load(anchor_ptr + rows, mask=row_ok, other=0)
    e = tl.load(w1_ptr + prev[:, None] * RANK + tl.arange(0, RANK)[None, :],
                mask=row_ok[:, None], other=0.0)
    next_base = _base_tile(base_ptr + rows * base_stride, program, V, row_ok, BLOCK)
    for step in range(K):
        base = next_base  # loaded a step ahead, while the programs wait
        next_base = _base_tile(base_ptr + rows * base_stride + (step + 1) * V, program, V,
                               row_ok & (step + 1 < K), BLOCK)
        # W2's columns as the tensor cores' left operand, read from shared memory
        bias = _round_bf16(tl.trans(tl.dot(w2, tl.trans(e), out_dtype=tl.float32)))
        z = _tile_values(bias, base, program, V, BLOCK)
        greedy, greedy_index = tl.max(z, axis=1, return_indices=True,
                                      return_indices_tie_break_left=True)
        best, index = _sampled_update(tl.full((R_PAD,), float("-inf"), tl.float64),
                                      tl.zeros((R_PAD,), tl.int32), z, program, V, t, hot,
                                      any_hot, _mix(key ^ step), BLOCK, False)
        best, index = _merge(hot, best, index, greedy, greedy_index + program * BLOCK)
        # Every program reduces the step itself once all have published: no program
        # waits on another's reduction. Bests alternate between two slots by step, as a
        # program can publish the next step while another still reads this one.
        slot = (step % 2) * R_PAD * PROGRAMS
        _publish(best, index, best_ptr + slot, index_ptr + slot, rows, program, PROGRAMS)
        tl.debug_barrier()
        tl.atomic_add(count_ptr + step, 1, sem="release")
        arrived = False
        while not arrived:
            arrived = tl.atomic_add(count_ptr + step, 0, sem="acquire") == PROGRAMS
        prev = _reduce(best_ptr + slot, index_ptr + slot, d2t_ptr, rows, R, V, PROGRAMS,
                       PARTS, HAS_D2T)
        # the next step's W1[prev] first, as early as it is known
        e = tl.load(w1_ptr + prev[:, None] * RANK + tl.arange(0, RANK)[None, :],
                    mask=row_ok[:, None] & (step + 1 < K), other=0.0)
        if program == 0:
            tl.store(ids_ptr + rows * K + step, prev, mask=row_ok)
