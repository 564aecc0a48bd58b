"""Compile backends. Each is one module with ``compile`` and ``load``:

- ``compile(step, examples, out_dir)`` writes the payload for every bucket into ``out_dir``
  (``examples[bucket]`` are example draft-step inputs of that batch size);
- ``load(out_dir, step, buckets)`` returns, per bucket, a callable with the draft step's
  signature that updates the KV cache in place and returns the draft step's outputs
  ``(ids, confidences, rules[, q])``.

A module may also have ``prepare(out_dir, device)``, what its load needs that does not
depend on the weights (its imports come with it), which the runtime runs on a thread while
the weights are read, before ``load``; set ``LOADS_WITHOUT_WEIGHTS`` where ``load`` only
keeps the step and reads its weights when called, so the runtime runs ``load`` on that
thread too, the step's tensors still on the meta device; and set ``DEVICES`` (device types
it runs on), ``DTYPE`` (a dtype it forces), and ``NEEDS`` (modules its build imports) with
``INSTALL`` (the command that brings them).
On a GPU the runtime records each bucket's callable as one CUDA graph.
Adding a backend is one module plus one line here.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch
from torch import Tensor, nn

from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftStep, KVCache
from dspark_compile.errors import ConfigError, MissingBackendError

REGISTRY = {
    "eager": "dspark_compile.compile.backends.eager",
    "inductor": "dspark_compile.compile.backends.inductor",
    "aoti": "dspark_compile.compile.backends.aoti",
    "tensorrt": "dspark_compile.compile.backends.tensorrt",
    "onnx": "dspark_compile.compile.backends.onnx",
}


def get_backend(name: str) -> ModuleType:
    if name not in REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; known backends: {sorted(REGISTRY)}")
    return importlib.import_module(REGISTRY[name])


def check_installed(name: str) -> None:
    """:class:`MissingBackendError` (with its install command) unless every module backend
    ``name`` builds with can be imported: before a build writes anything."""
    backend = get_backend(name)
    missing = [m for m in getattr(backend, "NEEDS", ()) if importlib.util.find_spec(m) is None]
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
