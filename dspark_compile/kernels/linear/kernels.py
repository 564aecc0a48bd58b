"""The skinny GEMM's kernel (see :mod:`dspark_compile.kernels.linear`)."""

import triton
import triton.language as tl


@triton.jit
def _linear_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, x_stride, w_stride, out_stride,
                   split_stride, K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   PRECISION: tl.constexpr):
    # One program: BLOCK_N output features of every row over one run of K_SPLIT columns
    # of K, the second grid axis's; each run writes its partial split_stride past the one
    # before (all of K in one run: the output itself). The weight's rows are the tensor
    # cores' left operand (BLOCK_N of them) and the few input rows the right one, so no
    # MMA is wasted on padding rows; the weight streams through the pipeline.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    start = tl.program_id(1) * K_SPLIT
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        ks = start + k0 + tl.arange(0, BLOCK_K)
        w_mask = (cols < N)[:, None]
        x_mask = (rows < M)[:, None]
        if K % BLOCK_K != 0:
            w_mask &= (ks < K)[None, :]
            x_mask &= (ks < K)[None, :]
        w = tl.load(w_ptr + cols[:, None] * w_stride + ks[None, :], mask=w_mask, other=0.0)
        x = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=x_mask, other=0.0)
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
    if HAS_BIAS:  # added before the one rounding, as cuBLAS's epilogue adds it
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + tl.program_id(1) * split_stride + rows[None, :] * out_stride + cols[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty),
             mask=(rows < M)[None, :] & (cols < N)[:, None])
