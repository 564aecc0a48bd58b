"""A draft step bound to fixed buffers, and recorded as one CUDA graph where it runs on a
GPU: the one place the runtime captures."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor


def bind(step: Callable, args: tuple[Tensor, ...], capture: bool,
         pool: Optional[tuple[int, int]] = None) -> Callable[[], tuple[Tensor, ...]]:
    """``step`` on fixed buffers ``args``, as a call with no arguments that runs it on
    whatever the buffers hold now.

    It runs ``step`` three times first: lazy initialisation (cuBLAS handles, workspaces,
    a compiled step's loading and autotuning) happens here. With ``capture`` the call is then recorded as one CUDA graph, and each call
    replays it and returns the same output tensors. The buffers must hold an inert round.
    """
    if not capture:
        for _ in range(3):
            step(*args)
        return lambda: step(*args)
    side = torch.cuda.Stream()  # warm up off the default stream, as graph capture wants
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step(*args)

    def replay() -> tuple[Tensor, ...]:
        graph.replay()
        return outputs
    return replay


def packed(step: Callable, count: int) -> Callable:
    """``step`` with its first ``count`` outputs returned as one byte tensor, then the rest:
    on a GPU the round downloads them in one copy instead of one each."""
    def run(*args: Tensor) -> tuple[Tensor, ...]:
        outputs = step(*args)
        return (torch.cat([t.reshape(-1).view(torch.uint8) for t in outputs[:count]]),
                *outputs[count:])
    return run


def host_views(layout: Sequence[tuple[tuple[int, ...], torch.dtype]], pinned: bool
               ) -> tuple[Tensor, list[Tensor]]:
    """One host byte buffer for what :func:`packed` returns, and a view of each output in
    it: ``layout`` their shapes and dtypes, in order (each at an offset its dtype
    divides)."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in layout]
    host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=pinned)
    return host, [part.view(dtype).view(shape)
                  for part, (shape, dtype) in zip(host.split(sizes), layout)]


def byte_views(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Each tensor's bytes (a view), for :func:`copy_into`."""
    return [t.view(torch.uint8) for t in tensors]


def copy_into(buffers: Sequence[Tensor], tensors: Sequence[Tensor],
              buffer_bytes: Optional[Sequence[Tensor]] = None) -> None:
    """Copy each tensor into its buffer of the same shape and dtype (a buffer passed as its
    own tensor is skipped). Where all are contiguous, as bytes: then they share one dtype,
    which CUDA copies in one multi-tensor kernel, where mixed dtypes take a memcpy each.
    ``buffer_bytes``, the buffers' :func:`byte_views` made once, saves making them here."""
    if buffer_bytes is None:
        buffer_bytes = byte_views(buffers)
    pairs = [(index, tensor) for index, (buffer, tensor)
             in enumerate(zip(buffers, tensors, strict=True)) if buffer is not tensor]
    if all(tensor.is_contiguous() for _, tensor in pairs):
        torch._foreach_copy_([buffer_bytes[index] for index, _ in pairs],
                             [tensor.view(torch.uint8) for _, tensor in pairs])
    else:
        torch._foreach_copy_([buffers[index] for index, _ in pairs],
                             [tensor for _, tensor in pairs])
