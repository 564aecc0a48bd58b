"""AOTInductor: ``torch.export`` + ``aoti_compile_and_package`` per bucket. The weights stay
out of the ``.pt2`` (the artifact's safetensors feed ``load_constants``), so three buckets
of a 27B-class drafter do not carry three copies of 8.8 GB. For loaders without Python (the
C++ runtime) the artifact also says what each package constant is made of
(``aoti_constants.json``: the weights file's tensors, concatenated in order) and holds the
constants that are no weights (``aoti_buffers.safetensors``: the RoPE tables)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from dspark_compile.draft import DraftStep
from dspark_compile.model.fused import state_sources
from dspark_compile import progress

CONSTANTS = "aoti_constants.json"
BUFFERS = "aoti_buffers.safetensors"

INDUCTOR_CONFIGS = {
    "aot_inductor.package_constants_in_so": False,
    "emulate_precision_casts": True,  # round bf16 intermediates as eager does
}
if sys.platform == "linux":
    # Link the process's libstdc++ by name: a GCC built to link it statically (the H200
    # image's /opt/gcc) gives wrapper.so a private copy whose std::locale is never set up,
    # and creating the model then crashes in std::regex (bench/results/issue3_h200/).
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


def compile(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    import torch._inductor

    write_constants(step, out_dir)
    for bucket, i, n in progress.buckets(examples):
        progress.phase(f"exporting bucket {bucket} ({i}/{n})")
        with torch.no_grad():
            program = torch.export.export(step, examples[bucket], strict=False)
        progress.phase(f"lowering, C++ compile and packaging of bucket {bucket} ({i}/{n})")
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(_package(out_dir, bucket)),
            inductor_configs=INDUCTOR_CONFIGS)


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
