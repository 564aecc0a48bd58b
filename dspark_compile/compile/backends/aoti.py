"""AOTInductor: ``torch.export`` + ``aoti_compile_and_package`` per bucket. The weights stay
out of the ``.pt2`` (the artifact's safetensors feed ``load_constants``), so three buckets
of a 27B-class drafter do not carry three copies of 8.8 GB. For loaders without Python (the
C++ runtime) the artifact also says what each package constant is made of
(``aoti_constants.json``: the weights file's tensors, concatenated in order) and holds the
constants that are no weights (``aoti_buffers.safetensors``: the RoPE tables) and the
prompt's append compiled for batches up to the largest bucket and prompts up to the context
capacity (``aoti_prefill.pt2``, :class:`~dspark_compile.draft.PrefillStep`), which the
Python runner runs eagerly instead."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from dspark_compile.compile.backends import lowering_options
from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftStep, PrefillStep
from dspark_compile.draft.checks import context_capacity
from dspark_compile.model.fused import state_sources
from dspark_compile import progress

DEVICES = ("cpu", "cuda")
DTYPE: Optional[str] = None
NEEDS: tuple[str, ...] = ()
INSTALL = ""
LOADS_WITHOUT_WEIGHTS = False

CONSTANTS = "aoti_constants.json"
BUFFERS = "aoti_buffers.safetensors"
PREFILL = "aoti_prefill.pt2"

INDUCTOR_CONFIGS = {
    "aot_inductor.package_constants_in_so": False,
    "emulate_precision_casts": True,  # round bf16 intermediates as eager does
}
if sys.platform == "linux":
    # Link the process's libstdc++ by name: a GCC built to link it statically (the H200
    # image's /opt/gcc) gives wrapper.so a private copy whose std::locale is never set up,
    # and creating the model then crashes in std::regex.
    INDUCTOR_CONFIGS["aot_inductor.custom_op_libs"] = [":libstdc++.so.6"]


def _package(out_dir: Path, bucket: int) -> Path:
    return out_dir / f"bucket{bucket}.pt2"


def write_constants(step: DraftStep, out_dir: Path) -> None:
    """Each constant of the step, by name: the weights it concatenates, or none where it
    is in :data:`BUFFERS`."""
    from safetensors.torch import save_file

    sources = {f"drafter.{name}": parts for name, parts in state_sources(step.drafter).items()}
    constants = {**dict(step.named_parameters()), **dict(step.named_buffers())}
    buffers = {name: t.detach().contiguous().cpu() for name, t in constants.items()
               if name not in sources}
    recipe = {name: sources.get(name, []) for name in constants}
    (out_dir / CONSTANTS).write_text(json.dumps(recipe, indent=1) + "\n")
    save_file(buffers, str(out_dir / BUFFERS))


def compile_bucket(step: DraftStep, bucket: int, example: tuple[Tensor, ...],
                   out_dir: Path) -> None:
    _export(step, example, _package(out_dir, bucket), "the draft step")


def finish(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    write_constants(step, out_dir)
    example, shapes = prefill_example(step.drafter.lane, examples[max(examples)])
    _export(PrefillStep(step.drafter), example, out_dir / PREFILL,
            "the prefill (batches up to the largest bucket, prompts up to the capacity)", shapes)


def _export(module: torch.nn.Module, example: tuple[Tensor, ...], package: Path, what: str,
            dynamic_shapes: Optional[tuple] = None) -> None:
    import torch._inductor

    progress.phase(f"exporting {what}")
    with torch.no_grad():
        program = torch.export.export(module, example, dynamic_shapes=dynamic_shapes,
                                      strict=False)
    progress.phase(f"lowering, C++ compile and packaging of {what}")
    device = example[0].device
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(package),
        inductor_configs={**INDUCTOR_CONFIGS, **lowering_options(device)})


def prefill_example(lane: LaneConfig, decode: tuple[Tensor, ...]
                    ) -> tuple[tuple[Tensor, ...], tuple]:
    """The prefill's example inputs (the largest bucket's, with one feature row more than a
    decode round) and their dynamic dimensions: the batch where the largest bucket holds
    more than one request (export fixes a dimension of size 1), and up to the context
    capacity's rows. The bound matters: without one, AOTInductor sizes its kernels' indices
    by the example, and a batch of long prompts overflows 32-bit indexing."""
    k_cache, v_cache, features, *rest = decode
    batch, decode_rows, width = features.shape
    example = (k_cache, v_cache, features.new_zeros(batch, decode_rows + 1, width), *rest)
    requests = {0: torch.export.Dim("requests", min=1, max=batch)} if batch > 1 else {}
    capacity = context_capacity(lane, k_cache.shape[-2])
    rows = {1: torch.export.Dim("rows", min=1, max=capacity)}
    shapes = tuple({**requests, **(rows if i == 2 else {})} or None for i in range(len(example)))
    return example, shapes


def prepare(out_dir: Path, device: torch.device) -> None:
    pass


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    weights = {**dict(step.named_parameters()), **dict(step.named_buffers())}
    runners = {}
    for bucket in buckets:
        # The package's C++ loader itself: torch._inductor's Python wrapper of it imports
        # Inductor and Dynamo (over a second of a cold start) and re-parses the output
        # spec on every call. Single-threaded: no internal stream syncs, so it can sit in a
        # CUDA graph.
        loader = torch._C._aoti.AOTIModelPackageLoader(str(_package(out_dir, bucket)), "model",
                                                      True, 1, -1)
        loader.load_constants({name: weights[name] for name in loader.get_constant_fqns()},
                              False, True, True)  # not inactive, check all, user-managed

        def run(*inputs: Tensor, loader=loader) -> tuple[Tensor, ...]:
            return tuple(loader.run(list(inputs)))
        runners[bucket] = run
    return runners
