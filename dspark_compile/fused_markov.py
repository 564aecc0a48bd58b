"""The k-step Markov walk (vanilla head, bf16) as one Triton launch per step: the op
``dspark::markov_walk``.

Each launch is one step. Its programs split the draft vocabulary into runs of tiles; for
each tile a program multiplies the ``W1[prev]`` rows it gathered once against the tile of
W2 on the tensor cores, rounds the bias to bf16, adds the step's base row and rounds again
(a bf16 ``+``), and keeps each request's best score and first index over its run. Greedy
rows compare the bf16 values in fp32, exactly. Sampled rows (T > 0) score ``z / T + G`` in
float64 as the reference does, but only where it can matter: one pass over an fp32
estimate of every column's score finds the tile's leader, the runner-up and so whether the
leader is alone, and whether the tile can beat the run's best at all; only then is the
leader scored in float64, or every column of a tile whose estimates leave two contenders.
The last program to finish (an atomic count) reduces the programs' bests, the lowest index
winning ties as in :func:`dspark_compile.draft.first_argmax`, maps the id through d2t and
writes it where the next step's launch reads its ``prev``. No ``[R, V]`` row is written,
and only ``[R, k]`` target ids leave the op.

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
    """How one step's launch is cut: requests padded to ``rows`` (the tensor cores' and
    Triton's power-of-two shapes), ``block`` columns per tile, ``warps`` per program, and
    at most ``programs_per_sm`` programs per streaming multiprocessor, each taking a run
    of whole tiles (fewer programs, fewer partial results for the last one to reduce)."""

    rows: int
    block: int
    warps: int
    programs_per_sm: int


# (block, warps, programs per SM) by padded batch, for a large draft vocabulary (the 27B
# lane's 248320) and a small one (the 35B-A3B lane's 32000): at 16 and 64 rows the fastest
# of the launches timed on the H200 (bench/results/issue5_h200/walk/launch_sweep/), at 32
# rows and past 64 untried guesses between them; all free of register spills on sm_90.
LAUNCHES = {16: ((64, 4, 2), (128, 8, 1)), 32: ((32, 4, 3), (64, 8, 1)),
            64: ((16, 4, 3), (64, 8, 1))}
SMALL_VOCAB = 65536


def launch_shape(rows: int, vocab: int) -> Launch:
    """The launch for ``rows`` requests over a draft vocabulary of ``vocab``."""
    padded = max(16, 1 << (rows - 1).bit_length())
    large, small = LAUNCHES.get(padded, ((16, 8, 1), (32, 8, 1)))
    return Launch(padded, *(small if vocab <= SMALL_VOCAB else large))


def grid(launch: Launch, tiles: int, sms: int) -> tuple[int, int]:
    """(programs, tiles per program) on ``sms`` multiprocessors: runs of equal length, as
    many programs as fit."""
    per_program = -(-tiles // min(tiles, sms * launch.programs_per_sm))
    return -(-tiles // per_program), per_program


def reduction_chunk(launch: Launch, programs: int) -> int:
    """How many programs' bests the last program loads at once: all of them, up to 4096
    values."""
    return min(1 << (programs - 1).bit_length(), max(32, 4096 // launch.rows))


if triton is not None:

    @triton.jit
    def _round_bf16(x):
        # fp32 -> nearest bf16 (ties to even), kept in fp32: the bit trick of draft.rounded
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000
        return bits.to(tl.float32, bitcast=True)

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
    def _tile_update(best, index, w1_row_ptr, w2_ptr, base_row_ptr, tile, V, t, hot, any_hot,
                     row_key, row_ok, RANK: tl.constexpr, BLOCK: tl.constexpr,
                     BLOCK_K: tl.constexpr):
        # The running (best score in float64, its first column) of each request, updated
        # with one tile; a tie keeps the earlier column.
        columns = tl.arange(0, BLOCK)
        cols = tile * BLOCK + columns
        col_ok = cols < V
        acc = tl.zeros((w1_row_ptr.shape[0], BLOCK), dtype=tl.float32)
        for start in tl.static_range(0, RANK, BLOCK_K):  # W2 tile by tile of the rank
            ranks = start + tl.arange(0, BLOCK_K)
            # W1[prev] again for every tile: from L1 after the first
            e = tl.load(w1_row_ptr[:, None] + ranks[None, :], mask=row_ok[:, None], other=0.0)
            w2 = tl.load(w2_ptr + cols[:, None] * RANK + ranks[None, :], mask=col_ok[:, None],
                         other=0.0)
            acc = tl.dot(e, tl.trans(w2), acc, out_dtype=tl.float32)
        bias = _round_bf16(acc)
        base = tl.load(base_row_ptr[:, None] + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        z = _round_bf16(base + bias)  # bf16 values, exact in fp32: greedy rows stay fp32
        z = tl.where(col_ok[None, :], z, float("-inf"))
        tile_best, tile_index = tl.max(z, axis=1, return_indices=True,
                                       return_indices_tie_break_left=True)
        better = ~hot & (tile_best.to(tl.float64) > best)
        best = tl.where(better, tile_best.to(tl.float64), best)
        index = tl.where(better, tile_index + tile * BLOCK, index)
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
    def _markov_step_kernel(w1_ptr, w2_ptr, base_ptr, anchor_ptr, temperature_ptr, seed_ptr,
                            position_ptr, d2t_ptr, best_ptr, index_ptr, count_ptr, ids_ptr,
                            R, V, k, base_stride, step, RANK: tl.constexpr,
                            R_PAD: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                            RUN: tl.constexpr, PROGRAMS: tl.constexpr, PARTS: tl.constexpr,
                            HAS_D2T: tl.constexpr):
        program = tl.program_id(0)
        rows = tl.arange(0, R_PAD)
        row_ok = rows < R
        # prev: the anchor at step 0, else the id the previous launch wrote
        prev = tl.load(anchor_ptr + rows, mask=row_ok & (step == 0), other=0)
        prev += tl.load(ids_ptr + rows * k + step - 1, mask=row_ok & (step > 0), other=0)
        w1_row_ptr = w1_ptr + prev * RANK
        temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=0.0)
        hot = temperature > 0
        any_hot = tl.max(hot.to(tl.int32), axis=0) > 0
        t = tl.where(hot, temperature, 1.0)
        row_key = _mix(tl.load(seed_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
        row_key = _mix(row_key ^ tl.load(position_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
        row_key = _mix(row_key ^ step)
        base_row_ptr = base_ptr + rows * base_stride + step * V

        best = tl.full((R_PAD,), float("-inf"), tl.float64)
        index = tl.zeros((R_PAD,), tl.int32)
        for nth in range(RUN):  # a run of RUN tiles; any past the vocabulary is all masked
            tile = program * RUN + nth
            best, index = _tile_update(best, index, w1_row_ptr, w2_ptr, base_row_ptr, tile, V,
                                       t, hot, any_hot, row_key, row_ok, RANK, BLOCK, BLOCK_K)
        tl.store(best_ptr + rows * PROGRAMS + program, best, mask=row_ok)
        tl.store(index_ptr + rows * PROGRAMS + program, index, mask=row_ok)

        # The last program to count itself reduces every program's best (the pattern of
        # Inductor's grid barrier: a CTA barrier, then a release / acquire atomic).
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + step, 1, sem="acq_rel") == PROGRAMS - 1:
            tl.debug_barrier()
            final_best = tl.full((R_PAD,), float("-inf"), tl.float64)
            final_index = tl.zeros((R_PAD,), tl.int32)
            for start in range(0, PROGRAMS, PARTS):  # most often all at once
                parts = start + tl.arange(0, PARTS)
                ok = row_ok[:, None] & (parts < PROGRAMS)[None, :]
                offsets = rows[:, None] * PROGRAMS + parts[None, :]
                # .cg: read at L2, where the other programs' stores are, not a stale L1
                part_best = tl.load(best_ptr + offsets, mask=ok, other=float("-inf"),
                                    cache_modifier=".cg")
                part_index = tl.load(index_ptr + offsets, mask=ok, other=0,
                                     cache_modifier=".cg")
                chunk_best = tl.max(part_best, axis=1)
                chunk_index = tl.min(tl.where(part_best == chunk_best[:, None], part_index, V),
                                     axis=1)
                better = chunk_best > final_best
                final_best = tl.where(better, chunk_best, final_best)
                final_index = tl.where(better, chunk_index, final_index)
            draft = final_index.to(tl.int64)
            if HAS_D2T:
                draft += tl.load(d2t_ptr + draft, mask=row_ok, other=0)
            tl.store(ids_ptr + rows * k + step, draft, mask=row_ok)

    @torch.library.triton_op("dspark::markov_walk", mutates_args=())
    def markov_walk(w1: Tensor, w2: Tensor, base: Tensor, anchor: Tensor, temperature: Tensor,
                    seed: Tensor, anchor_pos: Tensor, d2t: Optional[Tensor]) -> Tensor:
        """Target ids ``[R, k]`` of the k vanilla Markov steps from ``anchor`` over the base
        logits ``base [R, k, V]`` (see the module docstring)."""
        R, k, V = base.shape
        launch = launch_shape(R, V)
        sms = (torch.cuda.get_device_properties(base.device).multi_processor_count
               if base.is_cuda else 1)  # the interpreter's programs run one by one
        programs, run = grid(launch, triton.cdiv(V, launch.block), sms)
        best = torch.empty(R, programs, dtype=torch.float64, device=base.device)
        index = torch.empty(R, programs, dtype=torch.int32, device=base.device)
        count = torch.zeros(k, dtype=torch.int32, device=base.device)
        ids = torch.empty(R, k, dtype=torch.int64, device=base.device)
        # the kernel reads every [R] input with stride 1, W1 / W2 rows and base rows packed
        base, anchor, temperature, seed, anchor_pos, w1, w2 = (
            t.contiguous() for t in (base, anchor, temperature, seed, anchor_pos, w1, w2))
        for step in range(k):
            torch.library.wrap_triton(_markov_step_kernel)[(programs,)](
                w1, w2, base, anchor, temperature, seed, anchor_pos,
                anchor if d2t is None else d2t, best, index, count, ids, R, V, k,
                base.stride(0), step, RANK=w1.shape[1], R_PAD=launch.rows, BLOCK=launch.block,
                BLOCK_K=min(64, w1.shape[1]), RUN=run, PROGRAMS=programs,
                PARTS=reduction_chunk(launch, programs),
                HAS_D2T=d2t is not None, num_warps=launch.warps)
        return ids


else:

    def markov_walk(*args: object) -> Tensor:
        raise RuntimeError("the fused Markov step needs Triton on CUDA: pip install triton")
