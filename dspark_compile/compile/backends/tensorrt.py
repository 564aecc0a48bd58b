"""Torch-TensorRT, dynamo path: ``torch.export``, ``torch_tensorrt.dynamo.compile``, saved
as an exported program. An optional extra: ``pip install 'dspark-compile[tensorrt]'``.

Written against Torch-TensorRT's documented API; the machines this project is tested on
have no TensorRT libraries, so this backend has not run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from dspark_compile.compile.backends import FunctionalDraftStep
from dspark_compile.draft import DraftStep
from dspark_compile.errors import ConfigError, MissingBackendError
from dspark_compile import progress

DEVICES = ("cuda",)
DTYPE: Optional[str] = None
LOADS_WITHOUT_WEIGHTS = False
INSTALL = "pip install 'dspark-compile[tensorrt]' (a torch-tensorrt build matching your torch)"
NEEDS = ("torch_tensorrt",)  # checked before a build writes anything


def _torch_tensorrt():
    try:
        import torch_tensorrt
    except ImportError as err:
        raise MissingBackendError(f"backend 'tensorrt' needs Torch-TensorRT: {INSTALL}") from err
    return torch_tensorrt


def _program(out_dir: Path, bucket: int) -> Path:
    return out_dir / f"bucket{bucket}.ep"


def compile_bucket(step: DraftStep, bucket: int, example: tuple[Tensor, ...],
                   out_dir: Path) -> None:
    lane = step.drafter.lane
    for field, kernel in (("fused_attention", "fused attention"), ("skinny_gemm", "skinny GEMM")):
        if getattr(lane, field):
            raise ConfigError(f"backend 'tensorrt' cannot compile the {kernel} kernel: build "
                              f"this lane with lane.{field}=false")
    trt = _torch_tensorrt()
    dtype = step.drafter.lane.torch_dtype
    progress.phase("exporting and compiling with TensorRT")
    with torch.no_grad():
        program = torch.export.export(FunctionalDraftStep(step), example, strict=False)
        module = trt.dynamo.compile(program, arg_inputs=list(example),
                                    enabled_precisions={dtype})
    trt.save(module, str(_program(out_dir, bucket)), output_format="exported_program",
             arg_inputs=list(example))


def finish(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    pass


def prepare(out_dir: Path, device: torch.device) -> None:
    _torch_tensorrt()


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    trt = _torch_tensorrt()
    runners = {}
    for bucket in buckets:
        module = trt.load(str(_program(out_dir, bucket))).module()

        def run(k_cache: Tensor, v_cache: Tensor, *inputs: Tensor, module=module):
            *outputs, k_out, v_out = module(k_cache, v_cache, *inputs)
            k_cache.copy_(k_out)
            v_cache.copy_(v_out)
            return tuple(outputs)
        runners[bucket] = run
    return runners
