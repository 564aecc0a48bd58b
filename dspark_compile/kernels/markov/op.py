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
    return _walk(w1, w2, None, base, anchor, temperature, seed, anchor_pos, d2t)


@torch.library.triton_op("dspark::certified_markov_walk", mutates_args=())
def certified_markov_walk(w1: Tensor, w2: Tensor, norms: Tensor, base: Tensor,
                          anchor: Tensor, temperature: Tensor, seed: Tensor,
                          anchor_pos: Tensor, d2t: Optional[Tensor]
                          ) -> tuple[Tensor, Tensor]:
    """:func:`markov_walk`'s ids, each streamed step reading W2 only where a column can
    still win (``norms``: ``||W2[v]||`` rounded up, ``model.heads.row_norms``), and
    the rows of W2 each step read ``[k]`` (a resident walk reads all of W2 once, at its
    first step)."""
    read = torch.zeros(base.shape[1], dtype=torch.int32, device=base.device)
    ids = _walk(w1, w2, (norms, read), base, anchor, temperature, seed, anchor_pos, d2t)
    return ids, read


def _walk(w1: Tensor, w2: Tensor, certified: Optional[tuple[Tensor, Tensor]], base: Tensor,
          anchor: Tensor, temperature: Tensor, seed: Tensor, anchor_pos: Tensor,
          d2t: Optional[Tensor]) -> Tensor:
    # certified: (norms, the rows of W2 each step reads), or None for the full walk
    R, k, V = base.shape
    sms = (torch.cuda.get_device_properties(base.device).multi_processor_count
           if base.is_cuda else 1)  # the interpreter's programs run one by one
    shape = launch.launch_shape(R, V, w1.shape[1], sms)
    programs, run = launch.grid(shape, triton.cdiv(V, shape.block), sms)
    slots = (1 + shape.resident) * shape.rows * programs  # see the walk kernel
    best = torch.empty(slots, dtype=torch.float64, device=base.device)
    index = torch.empty(slots, dtype=torch.int32, device=base.device)
    count = torch.zeros((1 + (certified is not None)) * k, dtype=torch.int32,
                        device=base.device)  # the certified step's barriers too
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
        if certified is not None:
            certified[1][0] = V  # all of W2, once
        return ids
    if certified is not None and shape.rows > launch.CERTIFIED_ROWS:
        certified[1].fill_(V)  # the full walk: every row of W2, every step
        certified = None
    # the full walk's step reads none of these three: any pointer serves
    norms, read = certified if certified is not None else (best, count)
    least = (best if certified is None else
             torch.empty(shape.rows * programs, dtype=torch.float64, device=base.device))
    for step in range(k):
        torch.library.wrap_triton(_markov_step_kernel)[(programs,)](
            *args, k, base.stride(0), step, norms, least, read, RUN=run,
            REVERSE=step % 2 == 1, CERTIFIED=certified is not None, **options)
    return ids
