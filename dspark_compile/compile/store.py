"""The artifact store: ``<root>/<lane>-<lanehash>/<backend>/<b1-b2-..>/`` holding
``manifest.json``, the drafter's ``weights.safetensors`` and the backend's payload. Builds
become visible by one atomic rename, concurrent builders of a key wait on a file lock, and
a read checks the manifest, the environment and every file's sha256 before use: a file
past ``CHUNK_BYTES`` has a sha256 for each chunk as well, so that a read checks its chunks
in parallel (threads; hashlib releases the GIL) instead of one pass over the whole file,
and a loader can check the chunks of the weights as it reads them for use."""

from __future__ import annotations

import contextlib
import concurrent.futures
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from safetensors.torch import save_file

from dspark_compile import progress
from dspark_compile.compile.key import FORMAT_VERSION, ArtifactKey, file_sha256
from dspark_compile.errors import ArtifactError

MANIFEST = "manifest.json"
ARTIFACT_WEIGHTS = "weights.safetensors"
CHUNK_BYTES = 64 << 20
FINISHED = ".finished_buckets"  # in a staging directory: the buckets compiled so far


def build_or_reuse(key: ArtifactKey, root: Path,
                   write: Callable[[Path], None]) -> tuple[Path, bool]:
    """The artifact for ``key`` under ``root``: reused when a valid one exists, else built.

    ``write(staging)`` fills a hidden staging directory, which becomes visible by one
    rename once its manifest is written; a file lock makes concurrent builders of one key
    wait for each other, so they all end with the same artifact. A build that stops
    midway (an error, Ctrl-C) leaves the staging directory only where ``write`` marked a
    bucket finished in it (:func:`mark_finished`), for the next build of the key to keep.
    """
    final = key.directory(root)
    locks = Path(root) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with locked(locks / f"{final.parent.parent.name}.{final.parent.name}.{final.name}"):
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
        else:
            _say_why_not_reused(key, Path(root), final)
        # the directory's path holds the whole key: a staging directory there is this key's
        staging = final.parent / f".{final.name}.partial"
        if not (staging / FINISHED).exists():
            shutil.rmtree(staging, ignore_errors=True)  # a dead build's, with nothing to keep
        staging.mkdir(parents=True, exist_ok=True)
        try:
            start = time.perf_counter()
            with progress.reporting(f"building {key.backend} {final.name}"):
                write(staging)
                progress.phase("hashing the files")
                files, chunks = hashes(staging)
            manifest = {"format_version": FORMAT_VERSION, "key": key.digest(),
                        "key_text": key.text(), "lane": key.lane,
                        "weights_sha256": key.weights_sha256, "backend": key.backend,
                        "buckets": list(key.buckets), "with_probs": key.with_probs,
                        "dtype": key.lane["dtype"],
                        "k": key.lane["k"], "env": key.env, "files": files, "chunks": chunks,
                        "build_seconds": round(time.perf_counter() - start, 3)}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            (staging / FINISHED).unlink(missing_ok=True)
            os.rename(staging, final)
        finally:
            if not (staging / FINISHED).exists():
                shutil.rmtree(staging, ignore_errors=True)
            _remove_empty(final.parent, Path(root))
    return final, True


def finished_buckets(staging: Path) -> list[int]:
    """The buckets an earlier, interrupted build of this key finished in ``staging``."""
    try:
        return json.loads((staging / FINISHED).read_text())
    except (OSError, ValueError):
        return []


def mark_finished(staging: Path, bucket: int) -> None:
    """Record that ``bucket``'s payload in ``staging`` is complete (by one rename)."""
    done = sorted({*finished_buckets(staging), bucket})
    part = staging / f"{FINISHED}.part"
    part.write_text(json.dumps(done))
    os.replace(part, staging / FINISHED)


def _say_why_not_reused(key: ArtifactKey, root: Path, final: Path) -> None:
    """One line on stderr where an artifact of the same lane, weights, backend and buckets
    exists for another environment: what differs, so a rebuild is never silent."""
    for path in root.glob(f"{key.lane['name']}-*/{final.parent.name}/{final.name}/{MANIFEST}"):
        try:
            other = json.loads(path.read_text())
            same = (other["lane"], other["weights_sha256"]) == (key.lane, key.weights_sha256)
            env = other["env"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        differs = [f"{name} {env.get(name)!r} -> {key.env.get(name)!r}"
                   for name in sorted(set(env) | set(key.env)) if env.get(name) != key.env.get(name)]
        if same and differs:
            print(f"building anew: {path.parent} was built in another environment "
                  f"({'; '.join(differs)})", file=sys.stderr)
            return


def _remove_empty(directory: Path, root: Path) -> None:
    """``directory`` and its parents up to ``root``, where a failed build left them empty."""
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def save_weights(tensors: dict[str, torch.Tensor], directory: Path) -> None:
    path = directory / ARTIFACT_WEIGHTS
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))
    # safetensors writes 0600; a shared artifacts_dir needs the umask's mode
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def read_manifest(directory: Path, env: dict[str, Any],
                  unchecked: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The manifest of ``directory`` once it and every file it names check out, else
    :class:`ArtifactError` saying what is wrong. The sha256 of files in ``unchecked`` is
    left to the caller, who checks their :func:`sha256_spans` before using any byte."""
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
    if not _holds_its_key(manifest, key.fields()):
        raise ArtifactError(f"{path}: the manifest does not match its key: it was edited or "
                            "damaged; rebuild the artifact")
    for name in manifest["files"]:
        if not _plain_name(name):
            raise ArtifactError(f"{path}: file name {name!r} points outside the artifact")
        if not (directory / name).is_file():
            raise ArtifactError(f"{directory}: {name} is missing")
    failed = _failing(directory, manifest, [n for n in manifest["files"] if n not in unchecked])
    if failed:
        raise ArtifactError(f"{directory}: {failed} fails its sha256 check (corrupted or "
                            "modified); rebuild the artifact")
    if ARTIFACT_WEIGHTS not in manifest["files"]:
        raise ArtifactError(f"{path}: lists no {ARTIFACT_WEIGHTS}")
    return manifest


_SCHEMA = {"format_version": int, "key": str, "key_text": str, "lane": dict,
           "weights_sha256": str, "backend": str, "buckets": list, "with_probs": bool,
           "dtype": str, "k": int, "env": dict, "files": dict}


def _holds_its_key(manifest: dict[str, Any], fields: list[Any]) -> bool:
    """Whether the manifest's key text hashes to its key and says what its fields say."""
    text = manifest["key_text"]
    try:
        return (hashlib.sha256(text.encode()).hexdigest() == manifest["key"]
                and json.loads(text) == fields)
    except ValueError:
        return False


def hashes(directory: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Each file's sha256, and for a file past :data:`CHUNK_BYTES` each chunk's (not the
    hidden files of a staging directory)."""
    sizes = {p: p.stat().st_size for p in sorted(directory.iterdir())
             if p.is_file() and not p.name.startswith(".")}
    with _pool() as pool:
        whole = {p: pool.submit(file_sha256, p) for p in sizes}
        parts = {p: [pool.submit(file_sha256, p, offset, CHUNK_BYTES)
                     for offset in range(0, size, CHUNK_BYTES)]
                 for p, size in sizes.items() if size > CHUNK_BYTES}
        files = {p.name: future.result() for p, future in whole.items()}
        chunks = {p.name: {"bytes": CHUNK_BYTES, "size": sizes[p],
                           "sha256": [future.result() for future in futures]}
                  for p, futures in parts.items()}
    return files, chunks


def sha256_spans(directory: Path, manifest: dict[str, Any], name: str
                 ) -> list[tuple[int, int, str]]:
    """The (offset, length, sha256) spans file ``name`` is checked by: its chunks, or the
    whole file."""
    record = manifest.get("chunks", {}).get(name)
    if record is None:
        return [(0, (directory / name).stat().st_size, manifest["files"][name])]
    size, step = record["size"], record["bytes"]
    return [(offset, min(step, size - offset), sha)
            for offset, sha in zip(range(0, size, step), record["sha256"])]


def _failing(directory: Path, manifest: dict[str, Any], names: list[str]) -> Optional[str]:
    """The first of ``names`` whose bytes do not match: its size, then every span, all at
    once on a thread each."""
    checks = []  # (name, expected, offset, length)
    for name in names:
        spans = sha256_spans(directory, manifest, name)
        if (directory / name).stat().st_size != sum(length for _, length, _ in spans):
            checks.append((name, None, 0, 0))  # matches no sha256
            continue
        checks += [(name, sha, offset, length) for offset, length, sha in spans]
    with _pool() as pool:
        matches = list(pool.map(
            lambda c: file_sha256(directory / c[0], c[2], c[3]) == c[1], checks))
    return next((c[0] for c, ok in zip(checks, matches) if not ok), None)


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1)


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
    chunks = manifest.get("chunks", {})
    if not isinstance(chunks, dict) or not all(
            name in manifest["files"] and isinstance(r, dict)
            and isinstance(r.get("bytes"), int) and r["bytes"] > 0
            and isinstance(r.get("size"), int) and isinstance(r.get("sha256"), list)
            and len(r["sha256"]) == -(-r["size"] // r["bytes"])
            and all(isinstance(h, str) for h in r["sha256"])
            for name, r in chunks.items()):
        raise ArtifactError(f"{path}: chunks must map listed files to their chunk size, "
                            "file size and one sha256 a chunk")


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes, the file removed again on release:
    a waiter that then holds a file no longer at ``path`` opens it anew."""
    while True:
        handle = open(path, "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        handle.close()
