"""Loading an artifact in a fresh process. Imports no Hydra and no compiler beyond the
artifact's own backend."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from dspark_compile.checkpoint import load_weights, meta_drafter
from dspark_compile.checkpoint.staging import read_ahead, read_tensors
from dspark_compile.compile.backends import Backend, get_backend
from dspark_compile.compile.key import environment
from dspark_compile.compile.store import ARTIFACT_WEIGHTS, read_manifest, sha256_spans
from dspark_compile.config import LaneConfig, check_device
from dspark_compile.draft import DraftStep
from dspark_compile.errors import ArtifactError, ChecksumError, ConfigError
from dspark_compile.runtime.runner import Runner


def load_runner(artifact_dir: str | Path, device: torch.device | str = "cpu",
                buckets: Optional[Sequence[int]] = None) -> Runner:
    """Load an artifact built by ``dspark-compile``, all its buckets or the ``buckets``
    named. Refuses, with an :class:`~dspark_compile.errors.ArtifactError` naming what
    differs, an artifact from another environment or whose files fail their sha256. The
    runner's ``load_seconds`` says where the time went: its phases, one after the other,
    their total, and the seconds the backend took on a thread beside the weights' read."""
    device = check_device(device)
    directory = Path(artifact_dir)
    marks = [time.perf_counter()]
    read_ahead(directory / ARTIFACT_WEIGHTS)
    # the weights' sha256 is checked as they are read for use, in one pass over the file
    manifest = read_manifest(directory, environment(device), unchecked={ARTIFACT_WEIGHTS})
    marks.append(time.perf_counter())
    chosen = manifest["buckets"] if buckets is None else sorted(set(buckets))
    if not chosen or any(b not in manifest["buckets"] for b in chosen):
        raise ConfigError(f"buckets: {directory} holds buckets {manifest['buckets']}, "
                          f"asked for {list(buckets)}")
    try:
        lane = LaneConfig(**manifest["lane"])
    except (TypeError, ValueError) as err:
        raise ArtifactError(f"{directory}: the manifest's lane is not valid: {err}") from err
    # filled once its weights are read and checked; a backend that loads without them
    # holds its modules already
    drafter = meta_drafter(lane, device)
    step = DraftStep(drafter, manifest["with_probs"])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # the backend's imports, files and (where it can) load while the weights are read
        loading = pool.submit(_loaded_backend, manifest["backend"], directory, device, step,
                              chosen)
        try:
            tensors = read_tensors(directory / ARTIFACT_WEIGHTS, device, spans=sha256_spans(
                directory, manifest, ARTIFACT_WEIGHTS))
        except ChecksumError as err:  # the words read_manifest and the C++ runner use
            raise ArtifactError(f"{directory}: {ARTIFACT_WEIGHTS} fails its sha256 check "
                                "(corrupted or modified); rebuild the artifact") from err
        marks.append(time.perf_counter())
        backend, steps, beside = loading.result()
    load_weights(lane, {}, device, supplied=tensors, into=drafter)
    if steps is None:
        steps = backend.load(directory, step, chosen)
    marks.append(time.perf_counter())
    runner = Runner(manifest, drafter, steps, device, capture=device.type == "cuda")
    marks.append(time.perf_counter())
    phases = ("manifest and sha256", "weights and their sha256", "backend load",
              "warm-up and capture")
    runner.load_seconds = {phase: round(b - a, 4)
                           for phase, a, b in zip(phases, marks, marks[1:])}
    runner.load_seconds["total"] = round(marks[-1] - marks[0], 4)
    runner.load_seconds["backend beside the weights"] = round(beside, 4)
    return runner


def _loaded_backend(name: str, directory: Path, device: torch.device, step: DraftStep,
                    buckets: list[int]) -> tuple[Backend, Optional[dict], float]:
    """The backend, prepared, and its loaded steps if it loads without the step's weights
    (else None), with the seconds this took."""
    start = time.perf_counter()
    backend = get_backend(name)
    # this thread's CUDA calls (a load's kernels) on the artifact's device
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        backend.prepare(directory, device)
        steps = backend.load(directory, step, buckets) if backend.LOADS_WITHOUT_WEIGHTS else None
    return backend, steps, time.perf_counter() - start
