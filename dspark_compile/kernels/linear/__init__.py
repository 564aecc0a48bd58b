"""GEMMs of a few rows in Triton: the op ``dspark::linear``.

A decode round at batch 1 multiplies 9-16 rows by each weight: the GEMM is a stream of
the weight's bytes, and the few rows leave most of a tile idle where the rows are the
tensor cores' left operand. Here the weight's rows are: a program computes 64 output
features of every input row (``out^T = W x^T``), with the whole K of each, and as many
programs run as the features allow, each keeping several tiles of the weight in flight.
On the H200 the 27B lane's lm_head, gate|up and down read at 0.95-1.10x their bytes'
time where cuBLAS took 1.03-1.21x; Q|K|V and o tie with it
(``bench/results/issue27_h200/skinny_gemm/``). Where the output is narrow (fewer than 64
programs) cuBLAS's split-K is faster and stays.

Every path of a lane with ``skinny_gemm`` (the host path, the eager device path, the
compiled backends) runs the same launch for the same shapes, so they share its bits; a
test against a float64 recomputation checks what it computes. Off CUDA, and past
:data:`MAX_ROWS` rows, the GEMM is ``F.linear``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark_compile.kernels import register, runs_on

MAX_ROWS = 16  # past 16 rows the tile wastes no MMA and cuBLAS was faster (72-128 rows)


@dataclass(frozen=True)
class Launch:
    """``block_k`` columns of K per tile, ``stages`` tiles in flight (Triton's pipeline),
    ``features`` output features and ``warps`` per program."""

    block_k: int
    stages: int
    features: int = 64
    warps: int = 4


def launch_shape(rows: int, features: int, sms: int) -> Optional[Launch]:
    """The launch for ``rows`` input rows and ``features`` outputs on ``sms``
    multiprocessors, or None where cuBLAS is faster. Where the programs outnumber the
    multiprocessors several share one, each with three tiles of 128 columns in flight;
    where they do not, each keeps five tiles of 256 columns in flight alone. Of the
    launches timed on the H200 at both real lanes' batch-1 shapes, each is the fastest or
    within 4% of it; programs of 16 or 32 features, which give a narrow output more
    programs, were no faster than cuBLAS there
    (``bench/results/issue27_h200/context_fold/``)."""
    programs = -(-features // 64)
    if rows > MAX_ROWS or programs < 64:
        return None
    return Launch(128, 3) if programs > sms else Launch(256, 5)


def multiprocessors(device: torch.device) -> int:
    # Triton's interpreter runs the programs one at a time
    return torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else 1


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through ``dspark::linear`` where it applies: the
    kernels run on ``x``'s device, x has at most :data:`MAX_ROWS` rows and the output
    enough features (:func:`launch_shape`)."""
    rows = x.numel() // x.shape[-1]
    if not runs_on(x.device) or launch_shape(rows, weight.shape[0],
                                             multiprocessors(x.device)) is None:
        return F.linear(x, weight, bias)
    register()
    out = torch.ops.dspark.linear(x.reshape(rows, x.shape[-1]), weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])
