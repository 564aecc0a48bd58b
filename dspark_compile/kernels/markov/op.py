"""The op ``dspark::markov_walk``, registered on import (see the package docstring): imported
by :func:`dspark_compile.kernels.markov.register` only, where the kernels can run."""

from __future__ import annotations

from typing import Optional

import torch
import triton
from torch import Tensor

from dspark_compile.kernels.markov import launch
from dspark_compile.kernels.markov.kernels import _markov_step_kernel, _markov_walk_kernel


@torch.library.triton_op("dspark::markov_walk", mutates_args=())
def markov_walk(w1: Tensor, w2: Tensor, base: Tensor, anchor: Tensor, temperature: Tensor,
                seed: Tensor, anchor_pos: Tensor, d2t: Optional[Tensor]) -> Tensor:
    """Target ids ``[R, k]`` of the k vanilla Markov steps from ``anchor`` over the base
    logits ``base [R, k, V]`` (see the module docstring)."""
    R, k, V = base.shape
    sms = (torch.cuda.get_device_properties(base.device).multi_processor_count
           if base.is_cuda else 1)  # the interpreter's programs run one by one
    shape = launch.launch_shape(R, V, w1.shape[1], sms)
    programs, run = launch.grid(shape, triton.cdiv(V, shape.block), sms)
    slots = (1 + shape.resident) * shape.rows * programs  # see the walk kernel
    best = torch.empty(slots, dtype=torch.float64, device=base.device)
    index = torch.empty(slots, dtype=torch.int32, device=base.device)
    count = torch.zeros(k, dtype=torch.int32, device=base.device)
    ids = torch.empty(R, k, dtype=torch.int64, device=base.device)
    # the kernel reads every [R] input with stride 1, W1 / W2 rows and base rows packed
    base, anchor, temperature, seed, anchor_pos, w1, w2 = (
        t.contiguous() for t in (base, anchor, temperature, seed, anchor_pos, w1, w2))
    args = (w1, w2, base, anchor, temperature, seed, anchor_pos,
            anchor if d2t is None else d2t, best, index, count, ids, R, V)
    options = dict(RANK=w1.shape[1], R_PAD=shape.rows, BLOCK=shape.block,
                   PROGRAMS=programs, PARTS=launch.reduction_chunk(shape, programs),
                   HAS_D2T=d2t is not None, num_warps=shape.warps,
                   num_stages=shape.stages)
    if shape.resident:
        torch.library.wrap_triton(_markov_walk_kernel)[(programs,)](
            *args, base.stride(0), K=k, **options)
    else:
        for step in range(k):
            torch.library.wrap_triton(_markov_step_kernel)[(programs,)](
                *args, k, base.stride(0), step, RUN=run, REVERSE=step % 2 == 1, **options)
    return ids

