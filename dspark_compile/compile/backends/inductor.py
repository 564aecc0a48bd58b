"""``torch.compile`` with reduce-overhead's options per bucket; the compiled graphs travel as
Inductor's cache artifacts and the compiled C++ kernels beside them, so a fresh process
skips Inductor's and Triton's code generation and the C++ compiler (where the build's
Inductor cache started empty; kernels found there already travel when the graphs load
them, the CPU's ISA probes only when compiled)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Callable

import torch
import torch._inductor
from torch import Tensor

from dspark_compile.draft import DraftStep
from dspark_compile.kernels import markov
from dspark_compile import progress

PAYLOAD = "inductor_cache.bin"
KERNELS = "inductor_kernels.tar"
OWN_CUDA_GRAPH = True  # reduce-overhead records and replays its own graph


def guards_kept(entries: list) -> list[bool]:
    """Dynamo's guards worth their time on each call: those on the step's inputs (shapes
    pick the bucket's entry) and on the Python constants of its modules (``with_probs``,
    the lane's fields: they choose the graph, so two steps in one process never share
    one). Not those on the modules' tensors, types and dicts: the runtime never replaces
    them after loading, and Inductor's code checks its inputs' sizes itself."""
    return [not entry.orig_guard.source.is_unspecialized_nn_module()
            or entry.guard_type in ("CONSTANT_MATCH", "EQUALS_MATCH", "ID_MATCH")
            for entry in entries]


def compile_options() -> dict:
    """mode="reduce-overhead" as its options (torch.compile takes a mode or options, not
    both), plus emulate_precision_casts: every bf16 intermediate rounds as in eager (else
    fused kernels keep fp32 intermediates and the KV cache drifts from the eager path's
    bits), set for this compile only (set process-wide it also changed the bits of the host
    path's FlexAttention compiled after it), and the guard filter :func:`guards_kept`."""
    return {**torch._inductor.list_mode_options("reduce-overhead"),
            "emulate_precision_casts": True, "guard_filter_fn": guards_kept}


def _compiled(step: DraftStep) -> Callable:
    markov.register()  # Dynamo traces the walk at the build and again at the load
    compiled = torch.compile(step, options=compile_options(), fullgraph=True, dynamic=False)

    def call(*inputs: Tensor) -> tuple[Tensor, ...]:
        # The step writes the KV cache in place, and reduce-overhead graphs a function
        # that mutates its inputs only when they are static (otherwise it skips the CUDA
        # graph: "mutated inputs"). The runtime passes the same buffers every round.
        for tensor in inputs:
            torch._dynamo.mark_static_address(tensor)
        return compiled(*inputs)
    return call


def compile(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    cache = inductor_cache()
    before = set(cache.rglob("*.so"))
    compiled = _compiled(step)
    with torch.no_grad():
        for bucket, i, n in progress.buckets(examples):
            progress.phase(f"tracing, lowering and compiling bucket {bucket} ({i}/{n})")
            compiled(*examples[bucket])
    progress.phase("saving Inductor's cache artifacts and compiled kernels")
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        raise RuntimeError("Inductor produced no cache artifacts to save")
    (out_dir / PAYLOAD).write_bytes(saved[0])
    bundle = (mapped_libraries() | (set(cache.rglob("*.so")) - before))
    with tarfile.open(out_dir / KERNELS, "w") as tar:
        for path in sorted(p for p in bundle if p.is_relative_to(cache) and p.is_file()):
            relative = path.relative_to(cache)
            if relative.parts[0] != "triton":  # Triton's binaries are in the cache artifacts
                tar.add(path, arcname=relative.as_posix())


def inductor_cache() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()).resolve()


def mapped_libraries() -> set[Path]:
    """The shared libraries this process has mapped (``/proc/self/maps``; none listed
    without ``/proc``). The compiled C++ kernels (``*.so`` in Inductor's cache) that a
    build's graphs loaded, and the ones it compiled (the CPU's ISA probes among them), go
    into the artifact: Inductor's cache artifacts carry their source only, and a CPU load
    compiled every one again (58 compiler runs, a minute, for the tiny lane)."""
    maps = Path("/proc/self/maps")
    lines = maps.read_text().splitlines() if maps.exists() else []
    # address, permissions, offset, device, inode, then the mapped file's path if any
    return {Path(fields[5]) for fields in (line.split(maxsplit=5) for line in lines)
            if len(fields) == 6 and fields[5].endswith(".so")}


def unpack_kernels(tar_path: Path) -> None:
    """The bundled kernels into Inductor's cache, where it looks for each kernel by the
    hash of its source and compiler command (a torch installed elsewhere compiles them
    again). Files there already are kept; each new one appears by one rename, so a
    process loading at the same time never opens half a file."""
    root = inductor_cache()
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            relative = Path(member.name)
            if not member.isfile() or relative.is_absolute() or ".." in relative.parts:
                raise RuntimeError(f"{tar_path}: unexpected member {member.name!r}")
            target = root / relative
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(f".{target.name}.{os.getpid()}.part")
            part.write_bytes(tar.extractfile(member).read())
            os.replace(part, target)


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    torch.compiler.load_cache_artifacts((out_dir / PAYLOAD).read_bytes())
    unpack_kernels(out_dir / KERNELS)
    compiled = _compiled(step)  # recompiles per bucket shape, each from the cache
    return {bucket: compiled for bucket in buckets}
