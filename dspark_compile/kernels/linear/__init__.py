"""GEMMs of a few rows in Triton: the ops ``dspark::linear`` and ``dspark::linear_partials``.

A decode round at batch 1 multiplies 9-16 rows by each weight: the GEMM is a stream of
the weight's bytes, and the few rows leave most of a tile idle where the rows are the
tensor cores' left operand. Here the weight's rows are: a program computes 64 output
features of every input row (``out^T = W x^T``), with the whole K of each, and as many
programs run as the features allow, each keeping several tiles of the weight in flight.
On the 27B lane's lm_head, gate|up and down this reads closer to the weight's bytes'
time than cuBLAS; Q|K|V and o tie with it. An output too narrow to fill the
multiprocessors (fewer than 64 programs, as the 35B-A3B lane's o and down) splits K
instead: ``dspark::linear_partials`` writes each run's fp32 products, and :func:`linear`
sums them in torch ops, which a compiler fuses into the output's consumer (where cuBLAS
runs a split-K kernel and a reduction of its own).

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
    ``features`` output features and ``warps`` per program; ``splits`` equal runs of K,
    one program each, whose fp32 partials the caller sums (``dspark::linear_partials``)."""

    block_k: int
    stages: int
    features: int = 64
    warps: int = 4
    splits: int = 1


MAX_SPLITS = 8
SPLIT = (128, 4)  # block_k, stages of a program of a split launch


def launch_shape(rows: int, features: int, depth: int, sms: int) -> Optional[Launch]:
    """The launch for ``rows`` input rows, ``features`` outputs and ``depth`` (K) on ``sms``
    multiprocessors, or None where cuBLAS is faster. Where the programs outnumber the
    multiprocessors several share one, each with three tiles of 128 columns in flight;
    where they do not, each keeps five tiles of 256 columns in flight alone. Of the
    launches timed at both real lanes' batch-1 shapes, each is the fastest or within 4%
    of it. An output of fewer than 64 programs splits K into as many runs as
    fill the multiprocessors (at most :data:`MAX_SPLITS`, each a whole number of tiles),
    or stays on cuBLAS where K allows no two."""
    programs = -(-features // 64)
    if rows > MAX_ROWS:
        return None
    if programs >= 64:
        return Launch(128, 3) if programs > sms else Launch(256, 5)
    splits = min(MAX_SPLITS, sms // programs)
    while splits > 1 and depth % (splits * SPLIT[0]):
        splits -= 1
    return Launch(*SPLIT, splits=splits) if splits > 1 else None


def multiprocessors(device: torch.device) -> int:
    # Triton's interpreter runs the programs one at a time
    return torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else 1


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through the skinny GEMM where it applies: the kernels
    run on ``x``'s device, x has at most :data:`MAX_ROWS` rows and :func:`launch_shape`
    has a launch. A split launch's partials are summed here, in split order and in fp32,
    then rounded once: a compiler fuses that sum into the output's consumer (the residual
    add), so the split costs no launch of its own."""
    rows, depth = x.numel() // x.shape[-1], x.shape[-1]
    shape = launch_shape(rows, weight.shape[0], depth, multiprocessors(x.device)) \
        if runs_on(x.device) else None
    if shape is None:
        return F.linear(x, weight, bias)
    register()
    x2 = x.reshape(rows, depth)
    if shape.splits == 1:
        out = torch.ops.dspark.linear(x2, weight, bias)
    else:
        partials = torch.ops.dspark.linear_partials(x2, weight).unbind(0)
        out = partials[0]
        for partial in partials[1:]:
            out = out + partial
        out = (out if bias is None else out + bias.float()).to(x.dtype)
    return out.view(*x.shape[:-1], weight.shape[0])
