""":func:`dspark_compile.rng.uniform` as one Triton kernel, for code that runs eagerly on
the device (the speculative loop's verification): the hash's ~45 tensor ops are as many
launches there, each a few elements wide, where a compiled graph fuses them anyway.

The kernel runs the Markov kernels' hash (rng's mixes on uint32: a product wrapping at
2^32 is rng's masked int64 product, a shift its floor division) and the same exact float64
scaling, so its noise is bit-identical to the tensor ops'; where the kernels do not run,
:func:`uniform` is those ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark_compile import rng
from dspark_compile.kernels import runs_on

BLOCK = 128  # noise values a program hashes


def uniform(seed: Tensor, position: Tensor, step: int, size: int) -> Tensor:
    """``rng.uniform(seed, position, step, size)``: ``[R, size]`` float64 in (0, 1)."""
    if not runs_on(seed.device):
        return rng.uniform(seed, position, step, size)
    from dspark_compile.kernels.noise.kernels import uniform_kernel

    rows = seed.shape[0]
    out = torch.empty(rows, size, dtype=torch.float64, device=seed.device)
    if rows and size:
        uniform_kernel[(rows, -(-size // BLOCK))](
            seed.contiguous(), position.contiguous(), out, size, step, BLOCK=BLOCK)
    return out
