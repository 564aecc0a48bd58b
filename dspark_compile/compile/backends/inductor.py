"""``torch.compile`` per bucket, compiled ahead of time (``aot_compile``): each bucket's
file holds Dynamo's traced function with its guards and Inductor's compiled graph, so a
load neither traces nor lowers; the runtime records its call as one CUDA graph (what
reduce-overhead does, without that mode's Python work on every call). Beside the buckets
travel the compiled C++ kernels and Triton's compiled launchers, which the graphs name but
do not hold, so a fresh process runs no C or C++ compiler either (where the build's
Inductor cache started empty; kernels found there already travel when the graphs load
them, the CPU's ISA probes only when compiled). Each Triton kernel is saved with the one
config its build timed: a saved kernel of several configs looks for its choice by its
source's path in the build's Inductor cache (torch 2.11-2.13), so a load on a machine
without that cache would time every kernel's candidates again at its first call."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Optional
from unittest import mock

import torch
import torch._inductor
from torch import Tensor
from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir

from dspark_compile import kernels, progress
from dspark_compile.compile.backends import lowering_options
from dspark_compile.draft import DraftStep

KERNELS = "inductor_kernels.tar"
TRITON_FOLDER = "triton-cache"  # the tar's folder for Triton's launchers
STEP = "step"  # the name the saved functions give the live DraftStep they are called on
# the saved functions hold the step and read its weights only when called: the runtime
# loads them while the weights are read
LOADS_WITHOUT_WEIGHTS = True
DEVICES = ("cpu", "cuda")
DTYPE: Optional[str] = None
NEEDS: tuple[str, ...] = ()
INSTALL = ""


def _bucket_file(out_dir: Path, bucket: int) -> Path:
    return out_dir / f"inductor_bucket{bucket}.bin"


def _bucket_kernels(out_dir: Path, bucket: int) -> Path:
    return out_dir / f"inductor_kernels_bucket{bucket}.tar"


def guards_kept(entries: list) -> list[bool]:
    """Dynamo's guards worth their time on each call: those on the step's inputs (shapes
    pick the bucket's graph) and on the Python constants of its modules (``with_probs``,
    the lane's fields: a step of another lane or with ``with_probs`` set is refused, not
    run on this graph). Not those on the modules' tensors, types and dicts: the runtime
    never replaces them after loading, and Inductor's code checks its inputs' sizes itself.
    Nor those a saved function cannot hold (on objects' identities or on globals), nor the
    process's global state: it holds the thread count, which an engine sets for itself
    (the step's tokens with another one: ``tests/compile/test_inductor.py``)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [(not entry.orig_guard.source.is_unspecialized_nn_module()
             or entry.guard_type in ("CONSTANT_MATCH", "EQUALS_MATCH"))
            and not entry.is_global and entry.guard_type not in unsaved
            and entry.guard_type != "GLOBAL_STATE"
            for entry in entries]


def compile_options(device: torch.device) -> dict:
    """emulate_precision_casts: every bf16 intermediate rounds as in eager (else fused
    kernels keep fp32 intermediates and the KV cache drifts from the eager path's bits),
    set for this compile only (set process-wide it would also change the bits of whatever
    the process compiles after it), and the guard filter :func:`guards_kept`. No
    ``triton.cudagraphs`` (reduce-overhead): the runtime records the call in a CUDA graph of
    its own, so a round is one replay, not the CUDA graph tree's bookkeeping in Python
    first. Inductor's kernels launched from the binaries their saved function holds, so a
    load compiles none of them: kernel names without the fused ops' names (Triton cuts its
    files' names at 150 characters, where Inductor then finds no binary and compiles the
    kernel again at every load), and no ``dynamic_scale_rblock`` (a reduction's smaller
    blocks, which Inductor compiles after the saved binaries and, in torch 2.11, again at
    every load, then times against them). Our own kernels are found in Triton's cache. On
    the CPU also :func:`~dspark_compile.compile.backends.lowering_options`'s."""
    return {"emulate_precision_casts": True, "guard_filter_fn": guards_kept,
            "triton.descriptive_names": False, "dynamic_scale_rblock": False,
            **lowering_options(device)}


def aot_compiled(forward: Callable, example: tuple[Tensor, ...]) -> Callable:
    """``forward`` (a module's bound method) traced and compiled for ``example`` with this
    backend's options: a function to save (``save_compiled_function``), whose loaded copy
    is called with the module first."""
    # aot_compile is attached only where enabled (by default from torch 2.13 on)
    with torch._dynamo.config.patch(enable_aot_compile=True), torch.no_grad():
        compiled = torch.compile(forward, options=compile_options(example[0].device),
                                 fullgraph=True, dynamic=False)
        return compiled.aot_compile((example, {}))


def compile_bucket(step: DraftStep, bucket: int, example: tuple[Tensor, ...],
                   out_dir: Path) -> None:
    before = set(inductor_cache().rglob("*.so"))
    progress.phase("tracing, lowering and compiling")
    saved = aot_compiled(step.forward, example)
    timed = kernels_with_candidates()
    with torch.no_grad():  # Triton times each kernel's candidate configs at its first call
        saved(step, *example)
    if timed:
        progress.phase("compiling again on its kernels' timed configs")
        with kernels_on_timed_configs(example[0].device):
            saved = aot_compiled(step.forward, example)
    saved.save_compiled_function(str(_bucket_file(out_dir, bucket)), external_data={STEP: step})
    # this bucket's kernels kept beside it: a build resumed in another process bundles them
    write_bundle(_bucket_kernels(out_dir, bucket), bundled_files(before))


def finish(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    progress.phase("bundling the compiled kernels")
    parts = [_bucket_kernels(out_dir, bucket) for bucket in examples]
    with tarfile.open(out_dir / KERNELS, "w") as tar:
        names = set()
        for part in parts:
            with tarfile.open(part) as bucket_tar:
                for member in bucket_tar.getmembers():
                    if member.name not in names:
                        names.add(member.name)
                        tar.addfile(member, bucket_tar.extractfile(member))
    for part in parts:
        part.unlink()


def kernels_with_candidates() -> bool:
    """Whether a Triton kernel this process loaded was compiled for several candidate
    configs (found in the modules of the graphs it compiled, earlier ones too)."""
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    return any(isinstance(kernel, CachingAutotuner) and len(kernel.compile_results) > 1
               for module in PyCodeCache.modules for kernel in vars(module).values())


@contextlib.contextmanager
def kernels_on_timed_configs(device: torch.device):
    """A compile whose Triton kernels take the config their first call timed: it runs in an
    Inductor cache of its own that holds only the timed configs of the one in use, so each
    kernel's source is loaded again (in this process and in the compile workers, which
    keep the modules they loaded by their path) and finds its choice beside it. The kernel
    then holds that one config, and its saved copy has nothing to look up or time at a
    load. Triton's binaries still come from the cache in use."""
    from torch._inductor.async_compile import CompiledTritonKernels

    timed = inductor_cache()
    triton = os.environ.get("TRITON_CACHE_DIR") or triton_cache_dir(device.index or 0)
    with tempfile.TemporaryDirectory(prefix="dspark-inductor-") as new:
        for choice in timed.rglob("*.best_config"):
            target = Path(new) / choice.relative_to(timed)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(choice, target)
        CompiledTritonKernels.cache_clear()  # kernels by their source, whatever the cache
        with mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=new, TRITON_CACHE_DIR=triton):
            yield


def write_bundle(tar_path: Path, files: dict[str, Path]) -> None:
    """``files`` (by their names in the tar) into the tar that :func:`unpack_kernels` reads."""
    with tarfile.open(tar_path, "w") as tar:
        for name, path in sorted(files.items()):
            tar.add(path, arcname=name)


def bundled_files(before: set[Path]) -> dict[str, Path]:
    """The files a load would otherwise compile again, by their names in the tar: the C++
    kernels of Inductor's cache that this process mapped or compiled since ``before`` was
    listed (the saved functions carry their source only; the CPU's ISA probes among them),
    not its ``triton`` folder (Triton's binaries travel in the saved functions); and the
    launchers Triton compiled with the C compiler and this process mapped, from Triton's
    cache as it is now (Inductor points it into its own where unset) or its default."""
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
    without ``/proc``), also those whose file was replaced since: a build beside this one
    that compiled the same launcher puts it into the shared cache by a rename, leaving the
    same build under the same name."""
    maps = Path("/proc/self/maps")
    lines = maps.read_text().splitlines() if maps.exists() else []
    # address, permissions, offset, device, inode, then the mapped file's path if any
    paths = (fields[5].removesuffix(" (deleted)")
             for fields in (line.split(maxsplit=5) for line in lines) if len(fields) == 6)
    return {Path(path) for path in paths if path.endswith(".so")}


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


def prepare(out_dir: Path, device: torch.device) -> None:
    unpack_kernels(out_dir / KERNELS, device)
    kernels.register()  # the ops exist before the graphs that call them load


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    steps = {}
    # vec_isa_ok: Inductor takes the CPU's ISAs from its flags instead of compiling and
    # loading a probe for each in a child process (seconds on a CPU); the artifact's
    # environment pins the CPU's ISA and its kernels travel compiled
    with torch._inductor.config.patch({"cpp.vec_isa_ok": True}):
        for bucket in buckets:
            with open(_bucket_file(out_dir, bucket), "rb") as f:
                saved = torch.compiler.load_compiled_function(f, external_data={STEP: step})
            steps[bucket] = functools.partial(saved, step)  # saved from the unbound forward
    return steps
