"""The ops ``dspark::linear`` and ``dspark::linear_partials``, registered on import (see the
package docstring): imported by :func:`dspark_compile.kernels.register` only, where the
kernels can run."""

from __future__ import annotations

from typing import Optional

import torch
import triton
from torch import Tensor

from dspark_compile.kernels import linear
from dspark_compile.kernels.linear.kernels import _linear_kernel


def _launch(x: Tensor, weight: Tensor, bias: Optional[Tensor], splits: bool) -> Tensor:
    (M, K), N = x.shape, weight.shape[0]
    shape = linear.launch_shape(M, N, K, linear.multiprocessors(x.device))
    if shape is None or (shape.splits > 1) != splits:
        raise ValueError(f"dspark::linear{'_partials' if splits else ''}: no launch for {M} "
                         f"rows, {N} features and K = {K} (launch {shape})")
    out = torch.empty(*((shape.splits,) if splits else ()), M, N,
                      dtype=torch.float32 if splits else x.dtype, device=x.device)
    # the kernel takes rows' strides and reads each row's K values packed
    x, weight = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, weight))
    torch.library.wrap_triton(_linear_kernel)[(triton.cdiv(N, shape.features), shape.splits)](
        x, weight, x if bias is None else bias, out, M, N, x.stride(0), weight.stride(0),
        out.stride(-2), M * N, K=K, K_SPLIT=K // shape.splits,
        BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_N=shape.features,
        BLOCK_K=shape.block_k, HAS_BIAS=bias is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=shape.warps,
        num_stages=shape.stages)
    return out


@torch.library.triton_op("dspark::linear", mutates_args=())
def linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``x [M, K] @ weight [N, K]^T (+ bias)``, M <= ``MAX_ROWS``, in x's dtype."""
    return _launch(x, weight, bias, splits=False)


@torch.library.triton_op("dspark::linear_partials", mutates_args=())
def linear_partials_op(x: Tensor, weight: Tensor) -> Tensor:
    """``[splits, M, N]`` fp32: the products of x and weight over each of ``splits`` equal
    runs of K, whose sum in split order is ``x @ weight^T``."""
    return _launch(x, weight, None, splits=True)
