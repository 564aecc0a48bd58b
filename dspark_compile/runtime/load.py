"""Loading an artifact in a fresh process. Imports no Hydra and no compiler beyond the
artifact's own backend."""

from __future__ import annotations

from pathlib import Path

import torch

from dspark_compile.checkpoint import load_weights
from dspark_compile.compile.backends import get_backend
from dspark_compile.compile.key import environment
from dspark_compile.compile.store import ARTIFACT_WEIGHTS, read_manifest
from dspark_compile.config import LaneConfig, check_device
from dspark_compile.draft import DraftStep
from dspark_compile.errors import ArtifactError
from dspark_compile.runtime.runner import Runner


def load_runner(artifact_dir: str | Path, device: torch.device | str = "cpu") -> Runner:
    """Load an artifact built by ``dspark-compile``. Refuses, with an
    :class:`~dspark_compile.errors.ArtifactError` naming what differs, an artifact from
    another environment or whose files fail their sha256."""
    device = check_device(device)
    directory = Path(artifact_dir)
    manifest = read_manifest(directory, environment(device))
    try:
        lane = LaneConfig(**manifest["lane"])
    except (TypeError, ValueError) as err:
        raise ArtifactError(f"{directory}: the manifest's lane is not valid: {err}") from err
    drafter = load_weights(lane, directory / ARTIFACT_WEIGHTS, device)
    backend = get_backend(manifest["backend"])
    steps = backend.load(directory, DraftStep(drafter, manifest["with_probs"]),
                         manifest["buckets"])
    capture = device.type == "cuda" and not getattr(backend, "OWN_CUDA_GRAPH", False)
    return Runner(manifest, drafter, steps, device, capture)
