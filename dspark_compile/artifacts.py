"""The artifact cache: content-addressed keys, manifests, atomic builds, integrity checks.

Layout: ``<root>/<lane>-<lanehash>/<backend>/<b1-b2-..>/`` holding ``manifest.json``, the
drafter's ``weights.safetensors`` and the backend's payload. ``lanehash`` covers the lane
config, the weights' sha256, the artifact format and the environment (torch, triton, CUDA,
Python, device, and a fingerprint of this package's draft-step source), so another
environment or another version of the draft step never finds, and never loads, this one's
code.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from safetensors.torch import save_file

from dspark_compile import progress
from dspark_compile.backends import example_inputs, get_backend
from dspark_compile.checkpoint import cast_drafter
from dspark_compile.draft import DraftStep
from dspark_compile.errors import ArtifactError, ConfigError
from dspark_compile.model import Drafter

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


def compiled_sources() -> list[Path]:
    """This package's modules that the draft step and the backends import, transitively:
    the source that defines what gets compiled."""
    package = Path(__file__).resolve().parent
    todo, seen = [package / "draft.py", *package.glob("backends/*.py")], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("dspark_compile."):
                    module = package.joinpath(*name.split(".")[1:])
                    todo += [p for p in (module.with_suffix(".py"), module / "__init__.py")
                             if p.is_file()]
    return sorted(seen)


def code_fingerprint() -> str:
    """sha256 of :func:`compiled_sources`: a change to the draft step's arithmetic makes a
    new key, so an artifact of older code is never reused."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in compiled_sources():
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def environment(device: torch.device | str) -> dict[str, Any]:
    """What compiled code depends on, for ``device``: versions, hardware, our own source."""
    device = torch.device(device)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "triton": triton_version, "cuda": torch.version.cuda,
                           "dspark_code": code_fingerprint(), "device_type": device.type}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        env.update(gpu=torch.cuda.get_device_name(device), capability=f"{major}.{minor}")
    else:
        env.update(machine=platform.machine(), cpu_isa=torch.backends.cpu.get_cpu_capability())
    return env


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        digest.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ArtifactKey:
    lane: dict[str, Any]
    weights_sha256: str
    backend: str
    buckets: tuple[int, ...]
    env: dict[str, Any]
    with_probs: bool = False  # the step also returns the draft distribution q

    def digest(self) -> str:
        return _digest([FORMAT_VERSION, self.lane, self.weights_sha256, self.backend,
                        list(self.buckets), self.env, self.with_probs])

    def directory(self, root: Path) -> Path:
        lane_hash = _digest([FORMAT_VERSION, self.lane, self.weights_sha256, self.env])[:12]
        backend = self.backend + ("-probs" if self.with_probs else "")
        return (Path(root) / f"{self.lane['name']}-{lane_hash}" / backend
                / "-".join(map(str, self.buckets)))


def build_artifact(drafter: Drafter, backend_name: str, buckets: list[int],
                   root: str | Path, with_probs: bool = False) -> tuple[Path, bool]:
    """Compile ``drafter``'s draft step with one backend for these batch buckets, or reuse
    the artifact already built for the same key. Returns its directory and whether it was
    built. ``with_probs``: the step also returns q, for rejection sampling."""
    backend = get_backend(backend_name)
    device = drafter.fc.weight.device
    devices = getattr(backend, "DEVICES", ("cpu", "cuda"))
    if device.type not in devices:
        raise ConfigError(f"backend {backend_name!r} runs on {' or '.join(devices)}, "
                          f"not {device.type}")
    if getattr(backend, "DTYPE", drafter.lane.dtype) != drafter.lane.dtype:
        drafter = cast_drafter(drafter, backend.DTYPE)
    lane = drafter.lane
    buckets = sorted(set(buckets))
    if not buckets or buckets[0] < 1 or buckets[-1] > lane.max_batch:
        raise ConfigError(f"buckets {buckets}: each must be in [1, lane.max_batch="
                          f"{lane.max_batch}]")
    weights = drafter.state_dict()
    key = ArtifactKey(lane.to_dict(), tensors_sha256(weights), backend_name, tuple(buckets),
                      environment(device), with_probs)

    def write(tmp: Path) -> None:
        progress.phase("writing the weights")
        save_weights(weights, tmp)
        examples = {b: example_inputs(lane, b, device) for b in buckets}
        backend.compile(DraftStep(drafter, with_probs), examples, tmp)

    return build_or_reuse(key, Path(root), write)


def build_or_reuse(key: ArtifactKey, root: Path,
                   write: Callable[[Path], None]) -> tuple[Path, bool]:
    """The artifact for ``key`` under ``root``: reused when a valid one exists, else built.

    ``write(tmp_dir)`` fills a private temporary directory, which becomes visible by one
    rename once its manifest is written; a file lock makes concurrent builders of one key
    wait for each other, so they all end with the same artifact.
    """
    final = key.directory(root)
    final.parent.mkdir(parents=True, exist_ok=True)
    locks = Path(root) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with locked(locks / f"{final.parent.parent.name}.{final.parent.name}.{final.name}"):
        _remove_stale_temporaries(final)
        if final.exists():
            try:
                found = read_manifest(final, key.env)
                if found["key"] != key.digest():
                    raise ArtifactError(
                        f"its manifest is of another key (lane {found['lane'].get('name')!r}, "
                        f"backend {found['backend']!r}, buckets {found['buckets']})")
                return final, False
            except ArtifactError as err:
                print(f"rebuilding {final}: {err}", file=sys.stderr)
                shutil.rmtree(final)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            start = time.perf_counter()
            with progress.reporting(f"building {key.backend} {final.name}"):
                write(tmp)
                progress.phase("hashing the files")
                files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir())
                         if p.is_file()}
            manifest = {"format_version": FORMAT_VERSION, "key": key.digest(), "lane": key.lane,
                        "weights_sha256": key.weights_sha256, "backend": key.backend,
                        "buckets": list(key.buckets), "with_probs": key.with_probs,
                        "dtype": key.lane["dtype"],
                        "k": key.lane["k"], "env": key.env, "files": files,
                        "build_seconds": round(time.perf_counter() - start, 3)}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, True


def save_weights(tensors: dict[str, torch.Tensor], directory: Path) -> None:
    path = directory / WEIGHTS
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))
    # safetensors writes 0600; a shared artifacts_dir needs the umask's mode
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def read_manifest(directory: Path, env: dict[str, Any]) -> dict[str, Any]:
    """The manifest of ``directory`` once it and every file it names check out, else
    :class:`ArtifactError` saying what is wrong."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory}: no {MANIFEST}: not an artifact, or a half-written "
                            "one (builds become visible only when complete)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{path}: unreadable manifest: {err}") from err
    _check_schema(manifest, path)
    if manifest["format_version"] != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format {manifest['format_version']}, this "
                            f"dspark-compile reads format {FORMAT_VERSION}; rebuild it")
    differs = [f"{name}: artifact {manifest['env'].get(name)!r}, running {value!r}"
               for name, value in env.items() if manifest["env"].get(name) != value]
    if differs:
        raise ArtifactError(f"{directory} was built in another environment; rebuild it "
                            f"here. Differs: {'; '.join(differs)}")
    key = ArtifactKey(manifest["lane"], manifest["weights_sha256"], manifest["backend"],
                      tuple(manifest["buckets"]), manifest["env"], manifest["with_probs"])
    if key.digest() != manifest["key"]:
        raise ArtifactError(f"{path}: the manifest does not match its key: it was edited or "
                            "damaged; rebuild the artifact")
    for name, sha in manifest["files"].items():
        if not _plain_name(name):
            raise ArtifactError(f"{path}: file name {name!r} points outside the artifact")
        if not (directory / name).is_file():
            raise ArtifactError(f"{directory}: {name} is missing")
        if file_sha256(directory / name) != sha:
            raise ArtifactError(f"{directory}: {name} fails its sha256 check (corrupted or "
                                "modified); rebuild the artifact")
    if WEIGHTS not in manifest["files"]:
        raise ArtifactError(f"{path}: lists no {WEIGHTS}")
    return manifest


_SCHEMA = {"format_version": int, "key": str, "lane": dict, "weights_sha256": str,
           "backend": str, "buckets": list, "with_probs": bool, "dtype": str, "k": int,
           "env": dict, "files": dict}


def _check_schema(manifest: Any, path: Path) -> None:
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: manifest is not a JSON object")
    for field, kind in _SCHEMA.items():
        if not isinstance(manifest.get(field), kind):
            raise ArtifactError(f"{path}: field {field!r} missing or not a {kind.__name__}")
    buckets = manifest["buckets"]
    if not buckets or not all(isinstance(b, int) and b >= 1 for b in buckets):
        raise ArtifactError(f"{path}: buckets must be positive integers, got {buckets!r}")
    if not all(isinstance(v, str) for v in manifest["files"].values()):
        raise ArtifactError(f"{path}: files must map names to sha256 strings")


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) between processes."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale_temporaries(final: Path) -> None:
    """Temporary directories of builds that died midway: a live builder holds the lock we
    hold now, so any temporary left for this key is stale."""
    for tmp in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)
