"""The k-step Markov walk (vanilla head, bf16) in Triton: the op ``dspark::markov_walk``.

Two kernels, one arithmetic. Where W2 is larger than the GPU's shared memory (the 27B
lane's 127 MB) each step is one launch (``_markov_step_kernel``) that streams W2: its
programs split the draft vocabulary into runs of tiles, and the last program to finish
(an atomic count) reduces the programs' bests and writes the id the next launch reads as
its ``prev``. Where W2 fits (the 35B-A3B lane's 16 MB over 125 programs) one launch walks
all k steps (``_markov_walk_kernel``): each program reads its tile of W2 once and keeps it
in shared memory, and between steps every program waits until all have published their
bests, then reduces them itself.

Per tile, a program multiplies the ``W1[prev]`` rows it gathered once against the tile of
W2 on the tensor cores, rounds the bias to bf16, adds the step's base row and rounds again
(a bf16 ``+``). Greedy rows compare the bf16 values in fp32, exactly: a streaming program
keeps the best value and first column of each of a tile's column slots, elementwise, and
reduces across the slots once, after its run of tiles. Sampled rows (T > 0) score
``z / T + G`` in float64 as the reference does, but only where it can matter: one pass
over an fp32 estimate of every column's score finds the tile's leader, the runner-up and
so whether the leader is alone, and whether the tile can beat the best so far at all;
only then is the leader scored in float64, or every column of a tile whose estimates
leave two contenders. The reduction over programs lets the lowest index win ties as
:func:`dspark_compile.draft.first_argmax` does and maps the id through d2t. No ``[R, V]``
row is written, and only ``[R, k]`` target ids leave the op.

``torch.library.triton_op`` lets ``torch.compile``, ``torch.export`` and AOTInductor see
the kernel and keep it inside their graphs; its fake implementation comes from tracing.
Off CUDA the walk stays :func:`dspark_compile.draft.markov_loop`, the reference this
kernel is tested against.

Arithmetic: the bias is summed in fp32 like cuBLAS's bf16 GEMV, but in the tensor cores'
order, so its bf16 rounding can differ from the reference's in rare elements (two fp32
orders disagreed on about 7 in 100,000 on random weights); a token changes only where such
an element decides a near-tie. The benchmark and dspark-verify report the near-ties they meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheels of torch come without Triton
    triton = None


@dataclass(frozen=True)
class Launch:
    """How the walk is launched: requests padded to ``rows`` (the tensor cores' and
    Triton's power-of-two shapes), ``block`` columns per tile, ``warps`` per program, and
    at most ``programs_per_sm`` programs per streaming multiprocessor, each taking a run
    of whole tiles (fewer programs, fewer partial results for the last one to reduce),
    with ``stages`` tiles of W2 in flight (Triton's software pipeline; 3 is its default).
    ``resident``: one launch for all k steps, each program holding one tile of W2 on chip
    for the whole walk (where W2 fits in the multiprocessors' shared memory); otherwise
    one launch per step, streaming W2."""

    rows: int
    block: int
    warps: int
    programs_per_sm: int
    stages: int = 3
    resident: bool = False


# (block, warps, programs per SM) by padded batch where W2 is streamed every step: the
# fastest greedy launches timed on the H200 on the 27B lane, at 16 and 64 rows
# (bench/results/issue5_h200/resident/, 64 rows also against 32x8x1 in rows/steps/) and
# at 32 rows (rows/steps/); 64 rows is also the 35B-A3B lane's fastest on the kernel
# before (walk/launch_sweep/); 20 other launches at 64 rows, stages among them, were all
# slower (launch64/sweep/). Past 64 rows an untried guess. All free of register spills
# on sm_90 (128 columns at 64 rows spill and overflow shared memory).
LAUNCHES = {16: (128, 8, 1), 32: (128, 8, 1), 64: (64, 8, 1)}
# W2 bytes a resident program keeps in shared memory (an H200 program has 227 KB), and
# the most rows it drafts: past 16 its tile no longer fits in registers without spills
RESIDENT_BYTES = 128 * 1024
RESIDENT_ROWS = 16


def launch_shape(rows: int, vocab: int, rank: int, sms: int) -> Launch:
    """The launch for ``rows`` requests over a draft vocabulary of ``vocab`` and a Markov
    rank of ``rank`` on ``sms`` multiprocessors: resident where one tile per
    multiprocessor holds all of W2, streamed otherwise."""
    padded = max(16, 1 << (rows - 1).bit_length())
    columns = max(16, 1 << (-(-vocab // sms) - 1).bit_length())
    if padded <= RESIDENT_ROWS and columns * rank * 2 <= RESIDENT_BYTES:
        # 8 warps: the W2 tile passes through their registers on its way to shared memory
        return Launch(padded, columns, 8, 1, resident=True)
    return Launch(padded, *LAUNCHES.get(padded, (32, 8, 1)))


def grid(launch: Launch, tiles: int, sms: int) -> tuple[int, int]:
    """(programs, tiles per program) on ``sms`` multiprocessors: runs of equal length, as
    many programs as fit."""
    per_program = -(-tiles // min(tiles, sms * launch.programs_per_sm))
    return -(-tiles // per_program), per_program


def reduction_chunk(launch: Launch, programs: int) -> int:
    """How many programs' bests a reducing program loads at once: all of them, up to 4096
    values."""
    return min(1 << (programs - 1).bit_length(), max(32, 4096 // launch.rows))


if triton is not None:

    @triton.jit
    def _round_bf16(x):
        # fp32 -> nearest bf16 (ties to even), kept in fp32, as draft.rounded rounds: one
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
        # z / T + G in float64 for hash values h, as draft.sample computes it (rng.gumbel)
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
        # the step's base logits of one tile's columns
        cols = tile * BLOCK + tl.arange(0, BLOCK)
        return tl.load(base_row_ptr[:, None] + cols[None, :],
                       mask=row_ok[:, None] & (cols < V)[None, :], other=0.0)

    @triton.jit
    def _tile_values(bias, base, tile, V, BLOCK: tl.constexpr):
        # the step's bf16 logits z of one tile, exact in fp32 (-inf past the vocabulary)
        cols = tile * BLOCK + tl.arange(0, BLOCK)
        z = _round_bf16(base.to(tl.float32) + bias)
        return tl.where((cols < V)[None, :], z, float("-inf"))

    @triton.jit
    def _sampled_update(best, index, z, tile, V, t, hot, any_hot, row_key,
                        BLOCK: tl.constexpr):
        # The running (best score in float64, its first column) of each sampled request,
        # updated with one tile's values z; a tie keeps the earlier column.
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
                better = can_win & (hot_best > best)
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

    @triton.jit
    def _markov_step_kernel(w1_ptr, w2_ptr, base_ptr, anchor_ptr, temperature_ptr, seed_ptr,
                            position_ptr, d2t_ptr, best_ptr, index_ptr, count_ptr, ids_ptr,
                            R, V, k, base_stride, step, RANK: tl.constexpr,
                            R_PAD: tl.constexpr, BLOCK: tl.constexpr, RUN: tl.constexpr,
                            PROGRAMS: tl.constexpr, PARTS: tl.constexpr,
                            HAS_D2T: tl.constexpr):
        # One step: this program's run of RUN tiles of W2, streamed.
        program = tl.program_id(0)
        rows = tl.arange(0, R_PAD)
        row_ok = rows < R
        # prev: the anchor at step 0, else the id the previous launch wrote
        prev = tl.load(anchor_ptr + rows, mask=row_ok & (step == 0), other=0)
        prev += tl.load(ids_ptr + rows * k + step - 1, mask=row_ok & (step > 0), other=0)
        # W1[prev], once per program: every tile multiplies it
        e = tl.load(w1_ptr + prev[:, None] * RANK + tl.arange(0, RANK)[None, :],
                    mask=row_ok[:, None], other=0.0)
        t, hot, any_hot, key = _row_inputs(temperature_ptr, seed_ptr, position_ptr, rows,
                                           row_ok)
        base_row_ptr = base_ptr + rows * base_stride + step * V
        row_key = _mix(key ^ step)
        best = tl.full((R_PAD,), float("-inf"), tl.float64)
        index = tl.zeros((R_PAD,), tl.int32)
        # Greedy rows keep, in each of the BLOCK column slots, the best value and its first
        # column: elementwise per tile, reduced across the slots once, after the run.
        top = tl.full((R_PAD, BLOCK), float("-inf"), tl.float32)
        top_col = tl.zeros((R_PAD, BLOCK), tl.int32)
        # The base tile is loaded one tile ahead: Triton's pipeline prefetches only the
        # loads that feed tl.dot, and this one would otherwise stall every tile.
        next_base = _base_tile(base_row_ptr, program * RUN, V, row_ok, BLOCK)
        for nth in range(RUN):  # a run of RUN tiles; any past the vocabulary is all masked
            tile = program * RUN + nth
            base = next_base
            next_base = _base_tile(base_row_ptr, tile + 1, V, row_ok & (nth + 1 < RUN), BLOCK)
            cols = tile * BLOCK + tl.arange(0, BLOCK)
            w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                         mask=(cols < V)[:, None], other=0.0)
            bias = _round_bf16(tl.dot(e, tl.trans(w2), out_dtype=tl.float32))
            z = _tile_values(bias, base, tile, V, BLOCK)
            ahead = z > top  # tiles come in column order: a tie keeps the earlier column
            top = tl.where(ahead, z, top)
            top_col = tl.where(ahead, cols[None, :], top_col)
            best, index = _sampled_update(best, index, z, tile, V, t, hot, any_hot, row_key,
                                          BLOCK)
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
        # lines of L2 each step (1.05x-1.2x faster on the H200 at 16 to 1 rows,
        # bench/results/issue5_h200/rows/).
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
                                          any_hot, _mix(key ^ step), BLOCK)
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

    @torch.library.triton_op("dspark::markov_walk", mutates_args=())
    def markov_walk(w1: Tensor, w2: Tensor, base: Tensor, anchor: Tensor, temperature: Tensor,
                    seed: Tensor, anchor_pos: Tensor, d2t: Optional[Tensor]) -> Tensor:
        """Target ids ``[R, k]`` of the k vanilla Markov steps from ``anchor`` over the base
        logits ``base [R, k, V]`` (see the module docstring)."""
        R, k, V = base.shape
        sms = (torch.cuda.get_device_properties(base.device).multi_processor_count
               if base.is_cuda else 1)  # the interpreter's programs run one by one
        launch = launch_shape(R, V, w1.shape[1], sms)
        programs, run = grid(launch, triton.cdiv(V, launch.block), sms)
        slots = (1 + launch.resident) * launch.rows * programs  # see the walk kernel
        best = torch.empty(slots, dtype=torch.float64, device=base.device)
        index = torch.empty(slots, dtype=torch.int32, device=base.device)
        count = torch.zeros(k, dtype=torch.int32, device=base.device)
        ids = torch.empty(R, k, dtype=torch.int64, device=base.device)
        # the kernel reads every [R] input with stride 1, W1 / W2 rows and base rows packed
        base, anchor, temperature, seed, anchor_pos, w1, w2 = (
            t.contiguous() for t in (base, anchor, temperature, seed, anchor_pos, w1, w2))
        args = (w1, w2, base, anchor, temperature, seed, anchor_pos,
                anchor if d2t is None else d2t, best, index, count, ids, R, V)
        options = dict(RANK=w1.shape[1], R_PAD=launch.rows, BLOCK=launch.block,
                       PROGRAMS=programs, PARTS=reduction_chunk(launch, programs),
                       HAS_D2T=d2t is not None, num_warps=launch.warps,
                       num_stages=launch.stages)
        if launch.resident:
            torch.library.wrap_triton(_markov_walk_kernel)[(programs,)](
                *args, base.stride(0), K=k, **options)
        else:
            for step in range(k):
                torch.library.wrap_triton(_markov_step_kernel)[(programs,)](
                    *args, k, base.stride(0), step, RUN=run, **options)
        return ids


else:

    def markov_walk(*args: object) -> Tensor:
        raise RuntimeError("the fused Markov step needs Triton on CUDA: pip install triton")
