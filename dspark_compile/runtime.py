"""Load an artifact in a fresh process and draft with it.

Imports no Hydra and no compiler beyond the artifact's own backend.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Callable

import torch

from dspark_compile.artifacts import WEIGHTS, environment, read_manifest
from dspark_compile.backends import get_backend
from dspark_compile.checkpoint import load_weights
from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftOutput, DraftStep, KVCache, RoundInputs, check_round
from dspark_compile.errors import ArtifactError, InputError
from dspark_compile.model import Drafter


class Runner:
    """Drafts with one artifact. Request r of a call lives in row r of the runner's KV
    cache, which holds as many rows as the largest bucket; a call of R requests runs the
    smallest bucket >= R, padded with inert rows whose outputs are dropped.

    A round whose features have k+1 rows is one call of the compiled step. Any other width
    (a prompt) is first appended eagerly (prefill), then the compiled step runs with no new
    rows. Not thread-safe: one caller at a time.
    """

    def __init__(self, manifest: dict, drafter: Drafter, steps: dict[int, Callable],
                 device: torch.device):
        self.manifest = manifest
        self.lane: LaneConfig = drafter.lane
        self.drafter = drafter
        self.buckets = sorted(steps)
        self.steps = steps
        self.device = device
        self.cache = KVCache.allocate(self.lane, self.buckets[-1], device)
        self.max_context = self.cache.k.shape[3] - self.lane.block_rows - 1

    def bucket(self, batch: int) -> int:
        if not 1 <= batch <= self.buckets[-1]:
            raise InputError("batch", f"{batch} requests",
                             f"[1, {self.buckets[-1]}] (the largest bucket)")
        return self.buckets[bisect.bisect_left(self.buckets, batch)]

    def pad(self, inputs: RoundInputs, bucket: int) -> RoundInputs:
        """``inputs`` with inert rows up to ``bucket``: no new context, and an anchor at the
        context capacity, so their block rows land in scratch slots only."""
        extra = bucket - inputs.features.shape[0]
        if not extra:
            return inputs
        features, num_new, anchor, anchor_pos = inputs.tensors()
        zeros = torch.zeros(extra, dtype=torch.long, device=self.device)
        return RoundInputs(
            torch.cat([features, features.new_zeros(extra, *features.shape[1:])]),
            torch.cat([num_new, zeros]), torch.cat([anchor, zeros]),
            torch.cat([anchor_pos, zeros + self.max_context]))

    @torch.no_grad()
    def warm_up(self) -> None:
        """One all-inert round per bucket, so compiling (or loading) happens now rather than
        in the first real round. Inert rows write only scratch slots."""
        lane, device = self.lane, self.device
        empty = RoundInputs(
            torch.zeros(0, lane.k + 1, lane.feature_size, dtype=lane.torch_dtype, device=device),
            *(torch.zeros(0, dtype=torch.long, device=device) for _ in range(3)))
        for bucket in self.buckets:
            inert = self.pad(empty, bucket)
            self.steps[bucket](self.cache.k[:bucket], self.cache.v[:bucket], *inert.tensors())

    @torch.no_grad()
    def draft(self, inputs: RoundInputs) -> DraftOutput:
        batch = inputs.features.shape[0] if inputs.features.dim() == 3 else 0
        bucket = self.bucket(batch)
        check_round(self.lane, KVCache(self.cache.k[:batch], self.cache.v[:batch]), inputs)
        padded = self.pad(inputs, bucket)
        k_cache, v_cache = self.cache.k[:bucket], self.cache.v[:bucket]
        features, num_new, anchor, anchor_pos = padded.tensors()
        if features.shape[1] != self.lane.k + 1:  # prefill: append the prompt eagerly
            self.drafter.append_context(k_cache, v_cache, features, num_new, anchor_pos)
            features = features.new_zeros(bucket, self.lane.k + 1, features.shape[2])
            num_new = torch.zeros_like(num_new)
        ids, confidences = self.steps[bucket](k_cache, v_cache, features, num_new, anchor,
                                              anchor_pos)[:2]
        return DraftOutput(ids[:batch], confidences[:batch])


def load_runner(artifact_dir: str | Path, device: torch.device | str = "cpu") -> Runner:
    """Load an artifact built by ``dspark-compile``. Refuses, with an
    :class:`~dspark_compile.errors.ArtifactError` naming what differs, an artifact from
    another environment or whose files fail their sha256."""
    device = torch.device(device)
    directory = Path(artifact_dir)
    manifest = read_manifest(directory, environment(device))
    try:
        lane = LaneConfig(**manifest["lane"])
    except (TypeError, ValueError) as err:
        raise ArtifactError(f"{directory}: the manifest's lane is not valid: {err}") from err
    drafter = load_weights(lane, directory / WEIGHTS, device)
    steps = get_backend(manifest["backend"]).load(directory, DraftStep(drafter),
                                                  manifest["buckets"])
    runner = Runner(manifest, drafter, steps, device)
    runner.warm_up()
    return runner
