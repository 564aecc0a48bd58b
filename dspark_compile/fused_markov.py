"""One Markov step (vanilla head, bf16) as one Triton kernel: the op ``dspark::markov_step``.

The kernel gathers ``W1[prev]``, multiplies it against a tile of W2 on the tensor cores,
rounds the bias to bf16, adds the step's base row and rounds again (a bf16 ``+``), adds the
Gumbel noise on rows with T > 0 and reduces each tile to its best score and first index.
No ``[R, V]`` row is written: each program leaves one (score, index) pair per request, and
the first tile holding a request's maximum gives its id (the lowest index wins ties, as in
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
        scores = _round_bf16(base + bias).to(tl.float64)

        temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=0.0)
        hot = temperature > 0
        if tl.max(hot.to(tl.int32), axis=0) > 0:  # greedy batches skip the noise
            h = _mix(tl.load(seed_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
            h = _mix(h ^ tl.load(position_ptr + rows, mask=row_ok, other=0).to(tl.uint32))
            h = _mix(h ^ step)
            h = _mix(h[:, None] ^ cols[None, :].to(tl.uint32))
            u = (h.to(tl.float64) + 0.5) / 4294967296.0
            noisy = scores / tl.where(hot, temperature, 1.0).to(tl.float64)[:, None] \
                - tl.log(-tl.log(u))
            scores = tl.where(hot[:, None], noisy, scores)

        scores = tl.where(col_ok[None, :], scores, float("-inf"))
        best, index = tl.max(scores, axis=1, return_indices=True,
                             return_indices_tie_break_left=True)
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
