"""``torch.compile`` per bucket, its call recorded by the runtime as one CUDA graph (what
reduce-overhead does, without that mode's Python work on every call); the compiled graphs
travel as Inductor's cache artifacts, and beside them the compiled C++ kernels and Triton's compiled
launchers, so a fresh process skips Inductor's and Triton's code generation and the C and
C++ compilers (where the build's Inductor cache started empty; kernels found there already
travel when the graphs load them, the CPU's ISA probes only when compiled)."""

from __future__ import annotations

import importlib.util
import os
import tarfile
from pathlib import Path
from typing import Callable

import torch
import torch._inductor
from torch import Tensor
from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir

from dspark_compile import kernels, progress
from dspark_compile.draft import DraftStep

PAYLOAD = "inductor_cache.bin"
KERNELS = "inductor_kernels.tar"
TRITON_FOLDER = "triton-cache"  # the tar's folder for Triton's launchers


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
    """emulate_precision_casts: every bf16 intermediate rounds as in eager (else fused
    kernels keep fp32 intermediates and the KV cache drifts from the eager path's bits),
    set for this compile only (set process-wide it also changed the bits of the host path's
    FlexAttention compiled after it), and the guard filter :func:`guards_kept`. No
    ``triton.cudagraphs`` (reduce-overhead): the runtime records the call in a CUDA graph of
    its own, so a round is one replay, not Dynamo's guards and the CUDA graph tree's
    bookkeeping in Python first."""
    return {"emulate_precision_casts": True, "guard_filter_fn": guards_kept}


def _compiled(step: DraftStep) -> Callable:
    kernels.register()  # Dynamo traces the kernels at the build and again at the load
    return torch.compile(step, options=compile_options(), fullgraph=True, dynamic=False)


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
    with tarfile.open(out_dir / KERNELS, "w") as tar:
        for name, path in sorted(bundled_files(before).items()):
            tar.add(path, arcname=name)


def bundled_files(before: set[Path]) -> dict[str, Path]:
    """The files a load would otherwise compile again, by their names in the tar: the C++
    kernels of Inductor's cache that this process mapped or compiled since ``before`` was
    listed (the cache artifacts carry their source only; the CPU's ISA probes among them),
    not its ``triton`` folder (Triton's binaries are in the artifacts); and the launchers
    Triton compiled with the C compiler and this process mapped, from Triton's cache as it
    is now (Inductor points it into its own where unset) or its default."""
    inductor = inductor_cache()
    mapped = mapped_libraries()
    files = {}
    for path in mapped | (set(inductor.rglob("*.so")) - before):
        if path.is_relative_to(inductor) and path.is_file():
            relative = path.relative_to(inductor)
            if relative.parts[0] != "triton":
                files[relative.as_posix()] = path
    for root in triton_caches():
        for path in mapped:
            if path.is_relative_to(root) and path.is_file():
                files[f"{TRITON_FOLDER}/{path.relative_to(root).as_posix()}"] = path
    return files


def inductor_cache() -> Path:
    return Path(cache_dir()).resolve()


def triton_caches() -> set[Path]:
    """Where this process's Triton keeps its launchers: its cache directory now and its
    default one; none without Triton."""
    if importlib.util.find_spec("triton") is None:
        return set()
    from triton import knobs

    return {Path(knobs.cache.dir).resolve(), Path(knobs.cache.get_triton_dir("cache")).resolve()}


def mapped_libraries() -> set[Path]:
    """The shared libraries this process has mapped (``/proc/self/maps``; none listed
    without ``/proc``)."""
    maps = Path("/proc/self/maps")
    lines = maps.read_text().splitlines() if maps.exists() else []
    # address, permissions, offset, device, inode, then the mapped file's path if any
    return {Path(fields[5]) for fields in (line.split(maxsplit=5) for line in lines)
            if len(fields) == 6 and fields[5].endswith(".so")}


def unpack_kernels(tar_path: Path, device: torch.device) -> None:
    """The bundled kernels into Inductor's cache and the launchers into the Triton cache
    that Inductor points Triton at for ``device``, where each is looked for by the hash of
    its source and compiler command (a torch installed elsewhere compiles them again).
    Files there already are kept; each new one appears by one rename, so a process loading
    at the same time never opens half a file."""
    inductor, triton = inductor_cache(), Path(triton_cache_dir(device.index or 0))
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            relative = Path(member.name)
            if not member.isfile() or relative.is_absolute() or ".." in relative.parts:
                raise RuntimeError(f"{tar_path}: unexpected member {member.name!r}")
            if relative.parts[0] == TRITON_FOLDER:
                target = triton / relative.relative_to(TRITON_FOLDER)
            else:
                target = inductor / relative
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(f".{target.name}.{os.getpid()}.part")
            part.write_bytes(tar.extractfile(member).read())
            os.replace(part, target)


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    torch.compiler.load_cache_artifacts((out_dir / PAYLOAD).read_bytes())
    unpack_kernels(out_dir / KERNELS, next(step.parameters()).device)
    compiled = _compiled(step)  # recompiles per bucket shape, each from the cache
    return {bucket: compiled for bucket in buckets}
