"""What an artifact is the build of: its key (lane, weights, backend, buckets, environment)
and the fingerprint of the environment and of this package's draft-step source, so another
environment or another version of the draft step never finds, and never loads, this one's
code."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

FORMAT_VERSION = 3


# an import statement that starts a line, with a parenthesised list of names whole
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t][^\n(#]*(?:\([^)]*\))?",
                    re.MULTILINE)


def imported_modules(source: str) -> set[str]:
    """The modules a module's ``source`` imports, at its top level or inside functions, and
    for ``from m import n`` also ``m.n`` (a submodule where it is one). Only the import
    statements are parsed, not the whole file (a load checks this package's fingerprint:
    parsing every source took most of the manifest check); a line of prose that looks like
    one is skipped or adds a name, never drops one."""
    names = set()
    for match in IMPORT.finditer(source):
        try:
            statement = ast.parse(match.group().strip()).body[0]
        except SyntaxError:
            continue
        if isinstance(statement, ast.Import):
            names.update(alias.name for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom) and statement.module:
            names.add(statement.module)
            names.update(f"{statement.module}.{alias.name}" for alias in statement.names)
    return names


def compiled_sources() -> list[Path]:
    """This package's modules that the draft step and the backends import, transitively:
    the source that defines what gets compiled."""
    package = Path(__file__).resolve().parents[1]
    todo = [*package.glob("draft/*.py"), *package.glob("compile/backends/*.py")]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path.read_text()):
            if name.startswith("dspark_compile."):
                module = package.joinpath(*name.split(".")[1:])
                todo += [p for p in (module.with_suffix(".py"), module / "__init__.py")
                         if p.is_file()]
    return sorted(seen)


def code_fingerprint() -> str:
    """sha256 of :func:`compiled_sources`: a change to the draft step's arithmetic makes a
    new key, so an artifact of older code is never reused."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in compiled_sources():
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def triton_version() -> Optional[str]:
    """Triton's version from its installed package's metadata (PyTorch's nightly builds
    name it ``pytorch-triton``), not by importing it: a load that needs no Triton (aoti)
    would pay for the import; None without Triton."""
    for distribution in ("triton", "pytorch-triton"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def environment(device: torch.device | str) -> dict[str, Any]:
    """What compiled code depends on, for ``device``: versions, hardware, our own source.
    Triton only on CUDA: a CPU artifact's code never imports it, so installing or removing
    it must not make another key."""
    device = torch.device(device)
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "dspark_code": code_fingerprint(),
                           "device_type": device.type}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        env.update(gpu=torch.cuda.get_device_name(device), capability=f"{major}.{minor}",
                   triton=triton_version())
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


def file_sha256(path: Path, offset: int = 0, length: Optional[int] = None) -> str:
    """sha256 of the file's bytes from ``offset``, ``length`` of them (default: to the end).
    hashlib releases the GIL while it hashes, so threads hash ranges in parallel."""
    digest = hashlib.sha256()
    left = float("inf") if length is None else length
    with open(path, "rb") as f:
        f.seek(offset)
        while left > 0:
            piece = f.read(int(min(left, 1 << 24)))
            if not piece:
                break
            digest.update(piece)
            left -= len(piece)
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

    def fields(self) -> list[Any]:
        return [FORMAT_VERSION, self.lane, self.weights_sha256, self.backend,
                list(self.buckets), self.env, self.with_probs]

    def text(self) -> str:
        """The key's canonical text: the manifest carries it, so a reader (the C++ runtime)
        checks its sha256 and compares its parsed values, and never writes JSON as Python
        does."""
        return json.dumps(self.fields(), sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()

    def directory(self, root: Path) -> Path:
        lane_hash = _digest([FORMAT_VERSION, self.lane, self.weights_sha256, self.env])[:12]
        backend = self.backend + ("-probs" if self.with_probs else "")
        return (Path(root) / f"{self.lane['name']}-{lane_hash}" / backend
                / "-".join(map(str, self.buckets)))


