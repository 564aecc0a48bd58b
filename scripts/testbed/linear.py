"""An fp32 ``x @ W^T`` for the few rows of a decoding or verification pass, in Triton.

cuBLAS(Lt) multiplies 8 fp32 rows by a 576 x 1536 weight in 9 us (`gemmSN_TN`) where its
GEMV takes one row in 3.5 us: the GEMMs are a third of an 8-token pass of the target
(``passes.py --profile``). This kernel streams W once per block of 16 rows, each program a
block of W's rows, the products exact in fp32 (``input_precision="ieee"``: no TF32)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_M, BLOCK_K = 16, 64


@triton.jit
def _linear_kernel(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * K + k[None, :],
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + k[None, :],
                    mask=(rn[:, None] < N) & (k[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x [..., K] @ weight [N, K]^T`` in fp32 (meant for tens of rows, not a prompt's)."""
    assert x.dtype == weight.dtype == torch.float32 and weight.is_contiguous()
    lead, K = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, K).contiguous()
    M, N = x.shape[0], weight.shape[0]
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    block_n = 64 if N >= 8192 else 32  # the lm_head: fewer, longer programs
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, BLOCK_M))
    _linear_kernel[grid](x, weight, y, M, N, K, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                         BLOCK_K=BLOCK_K)
    return y.view(*lead, N)
