"""Wall time of a call on a device, and the kernel and CUDA-graph launches it makes."""

from __future__ import annotations

import statistics
import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` and its wall time in ms, the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - start) * 1e3


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn`` in ms over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, device)[1] for _ in range(repeats))


KERNEL_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                   "cuLaunchKernelEx"}


def launches(fn: Callable[[], object], device: torch.device) -> tuple[int, int]:
    """(CUDA graph launches, single kernel launches) of one call of ``fn``, as the profiler
    records the CUDA runtime calls; (0, 0) off the GPU."""
    if device.type != "cuda":
        return 0, 0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    names = [event.name for event in prof.events()]
    return names.count("cudaGraphLaunch"), sum(name in KERNEL_LAUNCHES for name in names)
