"""The op ``dspark::markov_walk``, registered on import (see the package docstring): imported
by :func:`dspark_compile.kernels.markov.register` only, where the kernels can run."""

from __future__ import annotations

from typing import Optional

import torch
import triton
from torch import Tensor

from dspark_compile.kernels.markov import launch
from dspark_compile.kernels.markov.bounds import _tile_maxima_kernel
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
        if certified is not None:
            certified[1][0] = V  # all of W2, once
        return ids
    if certified is not None and (shape.rows > launch.CERTIFIED_ROWS or run >= 64):
        certified[1].fill_(V)  # the full walk: every row of W2, every step
        certified = None
    if certified is None:  # the full walk's step reads none of these: any pointer serves
        bounds, tiles, extra = (best,) * 6, 0, dict(CERTIFIED=False, C=1, RUN_PAD=1)
    else:
        slots = shape.block // shape.rows  # candidates a request, in one tile's slots
        bounds, tiles = _tile_maxima(base, temperature, seed, anchor_pos, certified, shape,
                                     slots)
        extra = dict(CERTIFIED=True, C=slots, RUN_PAD=1 << (run - 1).bit_length())
    norms, candidates, top, size, norm_top, read = bounds
    for step in range(k):
        torch.library.wrap_triton(_markov_step_kernel)[(programs,)](
            *args, k, base.stride(0), step, norms, candidates, top, size, norm_top, tiles,
            read, RUN=run, REVERSE=step % 2 == 1, **options, **extra)
    return ids


def _tile_maxima(base: Tensor, temperature: Tensor, seed: Tensor, anchor_pos: Tensor,
                 certified: tuple[Tensor, Tensor], shape: launch.Launch, slots: int
                 ) -> tuple[tuple[Tensor, ...], int]:
    # The certified step's inputs, once per walk: W2's row norms, each request's and
    # step's candidates [R, k, C] (the best column of each segment, packed with its value,
    # see bounds.py), the tiles' largest values and |U| [R, k, tiles], the tiles' largest
    # norms [tiles], and the rows read [k]; and the number of tiles.
    norms, read = certified
    R, k, V = base.shape
    tiles = triton.cdiv(V, shape.block)
    top = torch.empty(R, k, tiles, dtype=torch.float32, device=base.device)
    size = torch.empty_like(top)
    norm_top = torch.empty(tiles, dtype=torch.float32, device=base.device)
    candidates = torch.full((R, k, slots), -(1 << 63), dtype=torch.int64, device=base.device)
    group = launch.PREPASS_TILES
    torch.library.wrap_triton(_tile_maxima_kernel)[(R * k, triton.cdiv(tiles, group))](
        base, temperature, seed, anchor_pos, norms, top, size, norm_top, candidates, V, k,
        tiles, base.stride(0), BLOCK=shape.block, GROUP=group,
        SEGMENT=launch.candidate_segment(tiles, slots) // group, C=slots)
    return (norms, candidates, top, size, norm_top, read), tiles
