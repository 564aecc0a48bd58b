"""Kernels of our own, registered as custom ops that every backend keeps in its graph:
``markov/`` (the Markov walk), ``attention/`` (the block's attention over the cache) and
``linear/`` (GEMMs of a few rows). For code that runs eagerly, where each tensor op is a
launch (no ops: a graph fuses tensor ops itself): ``noise/``, the counter-based noise in one
launch, and ``verify/``, the speculative loop's sampled verification in one.

The ops register where they first run or are traced, not at import: ``triton_op``
imports Inductor and Dynamo (seconds), which a process that only loads an ``aoti``
artifact never needs. What traces the step (a build, ``inductor``'s load) calls
:func:`register` first; an eager call registers its op itself."""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None  # CPU wheels of torch lack it
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter, on the CPU
# where the kernels can run: on CUDA, or in Triton's interpreter
RUNNABLE = HAS_TRITON and (torch.cuda.is_available() or INTERPRETED)
_registered = False


def register() -> None:
    """Registers ``dspark::markov_walk``, ``dspark::block_attention``, ``dspark::linear``
    and ``dspark::linear_partials`` where they can run, once."""
    global _registered
    if RUNNABLE and not _registered:
        from dspark_compile.kernels.attention import op as _attention  # noqa: F401
        from dspark_compile.kernels.linear import op as _linear  # noqa: F401
        from dspark_compile.kernels.markov import op as _markov  # noqa: F401
        _registered = True


def runs_on(device: torch.device) -> bool:
    """Whether the kernels run on tensors of ``device``."""
    return HAS_TRITON and (device.type == "cuda" or (INTERPRETED and device.type == "cpu"))
