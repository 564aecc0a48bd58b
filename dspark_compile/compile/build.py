"""Building an artifact: the drafter's weights and one backend's compiled draft step for
each batch bucket, in the store under its key."""

from __future__ import annotations

from pathlib import Path

from dspark_compile import kernels, progress
from dspark_compile.checkpoint import cast_drafter
from dspark_compile.compile.backends import check_installed, example_inputs, get_backend
from dspark_compile.compile.key import ArtifactKey, environment, tensors_sha256
from dspark_compile.compile.store import (build_or_reuse, finished_buckets, mark_finished,
                                          save_weights)
from dspark_compile.draft import DraftStep
from dspark_compile.errors import ConfigError
from dspark_compile.model import Drafter


def build_artifact(drafter: Drafter, backend_name: str, buckets: list[int],
                   root: str | Path, with_probs: bool = False) -> tuple[Path, bool]:
    """Compile ``drafter``'s draft step with one backend for these batch buckets, or reuse
    the artifact already built for the same key. Returns its directory and whether it was
    built. ``with_probs``: the step also returns q, for rejection sampling."""
    backend = get_backend(backend_name)
    device = drafter.fc.weight.device
    if device.type not in backend.DEVICES:
        raise ConfigError(f"backend {backend_name!r} runs on {' or '.join(backend.DEVICES)}, "
                          f"not {device.type}")
    check_installed(backend_name)
    if backend.DTYPE not in (None, drafter.lane.dtype):
        drafter = cast_drafter(drafter, backend.DTYPE)
    lane = drafter.lane
    buckets = sorted(set(buckets))
    if not buckets or buckets[0] < 1 or buckets[-1] > lane.max_batch:
        raise ConfigError(f"buckets {buckets}: each must be in [1, lane.max_batch="
                          f"{lane.max_batch}]")
    weights = drafter.state_dict()
    key = ArtifactKey(lane.to_dict(), tensors_sha256(weights), backend_name, tuple(buckets),
                      environment(device), with_probs)

    def write(staging: Path) -> None:
        progress.phase("writing the weights")
        save_weights(weights, staging)
        step = DraftStep(drafter, with_probs)
        examples = {b: example_inputs(lane, b, device) for b in buckets}
        kernels.register()  # before any trace of the step (a no-op where they cannot run)
        done = finished_buckets(staging)
        for i, bucket in enumerate(buckets, 1):
            with progress.part(f"bucket {bucket} ({i}/{len(buckets)})"):
                if bucket in done:
                    progress.phase("kept from an interrupted build")
                    continue
                backend.compile_bucket(step, bucket, examples[bucket], staging)
                mark_finished(staging, bucket)
        backend.finish(step, examples, staging)

    return build_or_reuse(key, Path(root), write)
