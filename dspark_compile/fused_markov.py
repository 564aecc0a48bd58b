"""One Markov step (vanilla head, bf16) as one Triton kernel: the op ``dspark::markov_step``.

The kernel gathers ``W1[prev]``, multiplies it against a tile of W2 on the tensor cores,
rounds the bias to bf16, adds the step's base row and rounds again (a bf16 ``+``) and reduces
each tile to its best score and first index. Greedy rows compare the bf16 values in fp32,
exactly. Sampled rows (T > 0) score ``z / T + G`` in float64 as the reference does, but only
where it can matter: an fp32 estimate of every column's score singles out the one column
that can win, and only that column is scored in float64; a tile whose estimates leave two
or more contenders is scored in float64 throughout. No ``[R, V]`` row is written: each
program leaves one (score, index) pair per request, and the first tile holding a request's
maximum gives its id (the lowest index wins ties, as in
:func:`dspark_compile.draft.first_argmax`).

``torch.library.triton_op`` lets ``torch.compile``, ``torch.export`` and AOTInductor see
the kernel and keep it inside their graphs; its fake implementation comes from tracing.
Off CUDA the step stays the loop body of :func:`dspark_compile.draft.markov_loop`, the
reference this kernel is tested against.

Arithmetic: the bias is summed in fp32 like cuBLAS's bf16 GEMV, but in the tensor cores'
order, so its bf16 rounding can differ from the reference's in rare elements (two fp32
orders disagreed on about 7 in 100,000 on random weights); a token changes only where such
an element decides a near-tie. The benchmark and dspark-verify report the near-ties they meet.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheels of torch come without Triton
    triton = None

BLOCK_V = 128  # draft-vocabulary columns per program, at most


def launch_shape(rows: int) -> tuple[int, int, int]:
    """(rows padded for the tensor cores, columns per program, warps) for ``rows`` requests:
    at most 4096 scores per program, with 8 warps, keeps the kernel free of register spills
    on sm_90 (``tests/test_fused_markov.py`` compiles it there)."""
    padded = max(16, 1 << (rows - 1).bit_length())
    return padded, BLOCK_V if padded == 16 else 64, 8


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
    def _markov_step_kernel(w1_ptr, w2_ptr, base_ptr, prev_ptr, temperature_ptr, seed_ptr,
                            position_ptr, best_ptr, index_ptr, R, V, base_stride, step,
                            RANK: tl.constexpr, R_PAD: tl.constexpr, BLOCK: tl.constexpr,
                            BLOCK_K: tl.constexpr):
        tile = tl.program_id(0)
        rows = tl.arange(0, R_PAD)
        row_ok = rows < R
        cols = tile * BLOCK + tl.arange(0, BLOCK)
        col_ok = cols < V

        prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
        acc = tl.zeros((R_PAD, BLOCK), dtype=tl.float32)
        for start in tl.static_range(0, RANK, BLOCK_K):  # W2 tile by tile of the rank
            ranks = start + tl.arange(0, BLOCK_K)
            e = tl.load(w1_ptr + prev[:, None] * RANK + ranks[None, :], mask=row_ok[:, None],
                        other=0.0)
            w2 = tl.load(w2_ptr + cols[:, None] * RANK + ranks[None, :], mask=col_ok[:, None],
                         other=0.0)
            acc = tl.dot(e, tl.trans(w2), acc, out_dtype=tl.float32)
        bias = _round_bf16(acc)
        both_ok = row_ok[:, None] & col_ok[None, :]
        base = tl.load(base_ptr + rows[:, None] * base_stride + cols[None, :], mask=both_ok,
                       other=0.0).to(tl.float32)
        z = _round_bf16(base + bias)  # bf16 values, exact in fp32: greedy rows stay fp32
        z = tl.where(col_ok[None, :], z, float("-inf"))
        best, index = tl.max(z, axis=1, return_indices=True, return_indices_tie_break_left=True)
        best = best.to(tl.float64)

        temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=0.0)
        hot = temperature > 0
        if tl.max(hot.to(tl.int32), axis=0) > 0:  # greedy batches skip the noise
            row_key = _mix(tl.load(seed_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
            row_key = _mix(row_key ^ tl.load(position_ptr + rows, mask=row_ok,
                                             other=0).to(tl.uint32))
            row_key = _mix(row_key ^ step)
            h = _mix(row_key[:, None] ^ cols[None, :].to(tl.uint32))
            t = tl.where(hot, temperature, 1.0)
            # The float64 score z / T + G of every column costs two float64 logs each; an
            # fp32 estimate (error below 2e-5 + 2e-7 |score|) finds the one column that can
            # win, and only it is scored in float64. Where the estimates cannot single one
            # out (near-ties, exact ties), the whole tile is scored in float64.
            estimate = tl.where(col_ok[None, :], z / t[:, None] + _gumbel_fp32(h),
                                float("-inf"))
            slack = 2e-4 + 1e-5 * tl.abs(estimate)
            lowest_best = tl.max(estimate - slack, axis=1)
            contenders = tl.sum((estimate + slack >= lowest_best[:, None]).to(tl.int32), axis=1)
            if tl.max(tl.where(hot, contenders, 0), axis=0) > 1:
                exact = tl.where(col_ok[None, :], _gumbel_scores(z, t[:, None], h),
                                 float("-inf"))
                hot_best, hot_index = tl.max(exact, axis=1, return_indices=True,
                                             return_indices_tie_break_left=True)
            else:
                _, hot_index = tl.max(estimate, axis=1, return_indices=True,
                                      return_indices_tie_break_left=True)
                picked = tl.arange(0, BLOCK)[None, :] == hot_index[:, None]
                z_picked = tl.max(tl.where(picked, z, float("-inf")), axis=1)
                h_picked = _mix(row_key ^ (tile * BLOCK + hot_index).to(tl.uint32))
                hot_best = _gumbel_scores(z_picked, t, h_picked)
            best = tl.where(hot, hot_best, best)
            index = tl.where(hot, hot_index, index)

        tiles = tl.num_programs(0)
        tl.store(best_ptr + rows * tiles + tile, best, mask=row_ok)
        tl.store(index_ptr + rows * tiles + tile, index + tile * BLOCK, mask=row_ok)

    @torch.library.triton_op("dspark::markov_step", mutates_args=())
    def markov_step(w1: Tensor, w2: Tensor, base: Tensor, prev: Tensor, temperature: Tensor,
                    seed: Tensor, anchor_pos: Tensor, step: int) -> Tensor:
        """Draft ids ``[R]`` of one vanilla Markov step (see the module docstring)."""
        R, V = base.shape
        padded, block, warps = launch_shape(R)
        tiles = triton.cdiv(V, block)
        best = torch.empty(R, tiles, dtype=torch.float64, device=base.device)
        index = torch.empty(R, tiles, dtype=torch.int64, device=base.device)
        # the kernel reads every [R] input with stride 1 and W1 / W2 rows packed
        prev, temperature, seed, anchor_pos, w1, w2 = (
            t.contiguous() for t in (prev, temperature, seed, anchor_pos, w1, w2))
        base = base if base.stride(1) == 1 else base.contiguous()
        torch.library.wrap_triton(_markov_step_kernel)[(tiles,)](
            w1, w2, base, prev, temperature, seed, anchor_pos, best, index, R, V,
            base.stride(0), step, RANK=w1.shape[1], R_PAD=padded, BLOCK=block,
            BLOCK_K=min(64, w1.shape[1]), num_warps=warps)
        return index.gather(1, best.argmax(1, keepdim=True)).squeeze(1)


else:

    def markov_step(*args: object) -> Tensor:
        raise RuntimeError("the fused Markov step needs Triton on CUDA: pip install triton")
