"""Compile backends. Each is one module that satisfies :class:`Backend`; adding a backend
is one module plus one line in :data:`REGISTRY`. On a GPU the runtime records each
bucket's callable as one CUDA graph.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Callable, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftStep, KVCache
from dspark_compile.errors import ConfigError, MissingBackendError

def lowering_options(device: torch.device) -> dict:
    """Inductor settings of both Inductor backends for a build on ``device``. On the CPU:
    lowering evaluates an inlined pointwise chain again at every use of each value in it,
    and the noise's hash uses each value twice, three times a mix, so one draw's lowering
    grows as 8 ** mixes. A result of more than 8 ops that is used twice is stored instead
    (the CPU's default is 50), with the same bits (the backends' tests; build times in
    BENCHMARKS.md). CUDA builds keep Inductor's default (above 30 ops), which the GPU
    lanes' timings measured."""
    return {"realize_opcount_threshold": 8} if device.type == "cpu" else {}


@runtime_checkable
class Backend(Protocol):
    """What the store and the runtime call a backend module with."""

    DEVICES: tuple[str, ...]  # the device types it runs on
    DTYPE: Optional[str]  # a dtype it forces on the drafter, or None
    NEEDS: tuple[str, ...]  # modules its build imports, checked before a build writes
    INSTALL: str  # the command that brings them
    # load() only keeps the step and reads its weights when called: the runtime runs it on
    # the thread that prepares, while the weights are read (the step still on meta)
    LOADS_WITHOUT_WEIGHTS: bool

    def compile_bucket(self, step: DraftStep, bucket: int, example: tuple[Tensor, ...],
                       out_dir: Path) -> None:
        """Write the payload of one batch bucket into ``out_dir``; a build that was
        interrupted resumes after the last bucket this finished."""

    def finish(self, step: DraftStep, examples: dict[int, tuple[Tensor, ...]],
               out_dir: Path) -> None:
        """Write what the buckets share, once every bucket is compiled."""

    def prepare(self, out_dir: Path, device: torch.device) -> None:
        """What ``load`` needs that does not depend on the weights (its imports too): the
        runtime runs it on a thread while the weights are read."""

    def load(self, out_dir: Path, step: DraftStep, buckets: list[int]
             ) -> dict[int, Callable]:
        """Per bucket, a callable with the draft step's signature that updates the KV
        cache in place and returns the step's outputs ``(ids, confidences, rules[, q])``."""


REGISTRY = {
    "eager": "dspark_compile.compile.backends.eager",
    "inductor": "dspark_compile.compile.backends.inductor",
    "aoti": "dspark_compile.compile.backends.aoti",
    "tensorrt": "dspark_compile.compile.backends.tensorrt",
    "onnx": "dspark_compile.compile.backends.onnx",
}


def get_backend(name: str) -> Backend:
    if name not in REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; known backends: {sorted(REGISTRY)}")
    module = importlib.import_module(REGISTRY[name])
    if not isinstance(module, Backend):
        members = [*Backend.__annotations__, *(n for n in vars(Backend) if not n.startswith("_"))]
        missing = [m for m in members if not hasattr(module, m)]
        raise TypeError(f"backend module {module.__name__} lacks {', '.join(sorted(missing))}")
    return module


def check_installed(name: str) -> None:
    """:class:`MissingBackendError` (with its install command) unless every module backend
    ``name`` builds with can be imported: before a build writes anything."""
    backend = get_backend(name)
    missing = [m for m in backend.NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingBackendError(f"backend {name!r} needs {', '.join(missing)}: "
                                  f"{backend.INSTALL}")


def example_inputs(lane: LaneConfig, batch: int, device: torch.device
                   ) -> tuple[Tensor, ...]:
    """Draft-step inputs of one decode round (k+1 feature rows) for tracing and warm-up."""
    cache = KVCache.allocate(lane, batch, device)
    features = torch.zeros(batch, lane.k + 1, lane.feature_size, dtype=lane.torch_dtype,
                           device=device)
    zeros = torch.zeros(batch, dtype=torch.long, device=device)
    # a hot temperature, so tracing sees the sampling branch as data, not as a constant
    temperature = torch.ones(batch, dtype=torch.float32, device=device)
    return (cache.k, cache.v, features, zeros, zeros.clone(), zeros.clone(), temperature,
            zeros.clone())


class FunctionalDraftStep(nn.Module):
    """The draft step returning the updated cache instead of writing it, for exporters
    (ONNX, TensorRT) whose graphs cannot mutate their inputs."""

    def __init__(self, step: DraftStep):
        super().__init__()
        self.step = step

    def forward(self, k_cache: Tensor, v_cache: Tensor, *inputs: Tensor) -> tuple[Tensor, ...]:
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        return (*self.step(k_cache, v_cache, *inputs), k_cache, v_cache)
