"""ONNX: ``torch.onnx.export(dynamo=True)`` of an fp32 copy of the draft step (the loop
unrolled), checked with ``onnx.checker``, run in onnxruntime on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import importlib

import torch
from torch import Tensor

from dspark_compile.compile.backends import FunctionalDraftStep
from dspark_compile.draft import DraftStep
from dspark_compile.errors import MissingBackendError
from dspark_compile import progress

DEVICES = ("cpu",)
DTYPE = "float32"
LOADS_WITHOUT_WEIGHTS = False
# onnxruntime's fp32 GEMMs sum in another order than torch's: hidden states, and so the
# confidences, differ in the last bits. Ids are still compared exactly.
CONFIDENCE_TOLERANCE = 1e-6
INPUTS = ["k_cache", "v_cache", "features", "num_new", "anchor", "anchor_pos", "temperature",
          "seed"]


def _outputs(step: DraftStep) -> list[str]:
    return ["ids", "confidences", "rules", *(["probs"] if step.with_probs else []), "k_cache_out",
            "v_cache_out"]


def _model(out_dir: Path, bucket: int) -> Path:
    return out_dir / f"bucket{bucket}.onnx"


INSTALL = "pip install 'dspark-compile[onnx]'"
NEEDS = ("onnx", "onnxruntime", "onnxscript")  # checked before a build writes anything


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingBackendError(f"backend 'onnx' needs {module}: {INSTALL}") from err


def compile_bucket(step: DraftStep, bucket: int, example: tuple[Tensor, ...],
                   out_dir: Path) -> None:
    onnx = _require("onnx")
    progress.phase("exporting to ONNX")
    with torch.no_grad():
        program = torch.onnx.export(FunctionalDraftStep(step), example, dynamo=True,
                                    input_names=INPUTS, output_names=_outputs(step))
    program.save(str(_model(out_dir, bucket)))
    model = onnx.load(str(_model(out_dir, bucket)))
    onnx.checker.check_model(model)
    for node in model.graph.node:
        if node.op_type == "ArgMax" and any(
                a.name == "select_last_index" and a.i for a in node.attribute):
            raise RuntimeError(f"{node.name}: ArgMax exported with select_last_index=1; "
                               "the draft step needs the first index to win ties")


def finish(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    pass


def prepare(out_dir: Path, device: torch.device) -> None:
    _require("onnxruntime")


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    ort = _require("onnxruntime")
    runners = {}
    for bucket in buckets:
        session = ort.InferenceSession(str(_model(out_dir, bucket)),
                                       providers=["CPUExecutionProvider"])

        def run(k_cache: Tensor, v_cache: Tensor, *inputs: Tensor, session=session):
            feeds = {name: t.numpy() for name, t in zip(INPUTS, (k_cache, v_cache, *inputs))}
            *outputs, k_out, v_out = session.run(_outputs(step), feeds)
            k_cache.copy_(torch.from_numpy(k_out))
            v_cache.copy_(torch.from_numpy(v_out))
            return tuple(torch.from_numpy(t) for t in outputs)
        runners[bucket] = run
    return runners
