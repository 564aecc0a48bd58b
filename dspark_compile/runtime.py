"""Load an artifact in a fresh process and draft with it.

Imports no Hydra and no compiler beyond the artifact's own backend.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from dspark_compile.artifacts import WEIGHTS, environment, read_manifest
from dspark_compile.backends import get_backend
from dspark_compile.checkpoint import load_weights
from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftOutput, DraftStep, KVCache, RoundInputs, check_round
from dspark_compile.errors import ArtifactError, InputError, RunnerBusyError
from dspark_compile.model import Drafter


class Runner:
    """Drafts with one artifact, for requests that come and go.

    ``admit()`` gives a request a slot; ``draft(inputs, slots)`` drafts one round for some
    admitted slots (row i of ``inputs`` belongs to ``slots[i]``); ``release(slot)`` frees
    it. Each slot owns one row of the runner's KV cache, which holds as many rows as the
    largest bucket. Rows are kept dense: releasing a slot moves the last row into the hole,
    so a round always runs the smallest bucket that covers every admitted slot. Rows that
    take no part in a round are inert: no new context, and an anchor at the context
    capacity, so their block K/V land in scratch slots only and their outputs are dropped.

    A round whose features have k+1 rows is one call of the compiled step; any other width
    (a prompt) is first appended eagerly (prefill), then the compiled step runs with no new
    rows.

    Threading: a runner is not thread-safe. A call made while another thread is inside
    the same runner raises :class:`RunnerBusyError` instead of waiting or corrupting state;
    use one runner per thread, or serialise the calls.
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
        self._rows: dict[int, int] = {}  # slot -> cache row; rows 0..len-1 are taken
        self._next_slot = 0
        self._busy = threading.Lock()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise RunnerBusyError("this Runner is already running a call in another thread; "
                                  "a Runner is not thread-safe: use one per thread or "
                                  "serialise the calls")
        try:
            yield
        finally:
            self._busy.release()

    def admit(self) -> int:
        """A new request's slot (its KV row starts empty: its first round is its prompt)."""
        with self._exclusive():
            if len(self._rows) == self.buckets[-1]:
                raise InputError("slots", f"all {self.buckets[-1]} rows in use",
                                 "release a slot first (capacity = the largest bucket)")
            slot, self._next_slot = self._next_slot, self._next_slot + 1
            self._rows[slot] = len(self._rows)
            return slot

    def release(self, slot: int) -> None:
        with self._exclusive():
            row = self._row(slot)
            del self._rows[slot]
            last = len(self._rows)
            if row != last:  # keep rows dense: the last request moves into the hole
                moved = next(s for s, r in self._rows.items() if r == last)
                self.cache.k[row] = self.cache.k[last]
                self.cache.v[row] = self.cache.v[last]
                self._rows[moved] = row

    @property
    def slots(self) -> list[int]:
        """The admitted slots."""
        return sorted(self._rows)

    def row_of(self, slot: int) -> int:
        return self._row(slot)

    def _row(self, slot: int) -> int:
        if slot not in self._rows:
            raise InputError("slot", f"{slot!r} is not admitted",
                             f"one of {sorted(self._rows)}")
        return self._rows[slot]

    def bucket(self, rows: int) -> int:
        if not 1 <= rows <= self.buckets[-1]:
            raise InputError("batch", f"{rows} requests",
                             f"[1, {self.buckets[-1]}] (the largest bucket)")
        return self.buckets[bisect.bisect_left(self.buckets, rows)]

    def layout(self, inputs: RoundInputs, slots: Sequence[int]) -> tuple[RoundInputs, Tensor]:
        """The bucket-sized round the compiled step runs, and the cache row of each input
        row: every input row at its slot's row, inert rows everywhere else."""
        rows = torch.tensor([self._row(s) for s in slots], dtype=torch.long,
                            device=self.device)
        bucket = self.bucket(len(self._rows))
        features, num_new, anchor, anchor_pos, temperature, seed = inputs.tensors()
        full = RoundInputs(
            features.new_zeros(bucket, *features.shape[1:]).index_copy(0, rows, features),
            num_new.new_zeros(bucket).index_copy(0, rows, num_new),
            anchor.new_zeros(bucket).index_copy(0, rows, anchor),
            anchor_pos.new_full((bucket,), self.max_context).index_copy(0, rows, anchor_pos),
            temperature.new_zeros(bucket).index_copy(0, rows, temperature),
            seed.new_zeros(bucket).index_copy(0, rows, seed))
        return full, rows

    @torch.no_grad()
    def draft(self, inputs: RoundInputs, slots: Sequence[int]) -> DraftOutput:
        """One round for ``slots``; ids and confidences in the order of ``slots``."""
        with self._exclusive():
            self._check(inputs, slots)
            full, rows = self.layout(inputs, slots)
            return self._run(full).select(rows)

    def _check(self, inputs: RoundInputs, slots: Sequence[int]) -> None:
        if not isinstance(slots, Sequence) or not slots:
            raise InputError("slots", repr(slots), "a non-empty sequence of admitted slots")
        for slot in slots:
            self._row(slot)
        if len(set(slots)) != len(slots):
            raise InputError("slots", f"{list(slots)} repeats a slot", "distinct slots")
        features = inputs.features
        if isinstance(features, Tensor) and features.dim() == 3 \
                and features.shape[0] != len(slots):
            raise InputError("features", f"{features.shape[0]} rows for {len(slots)} slots",
                             "one row per slot")
        # shapes and ranges; the cache view only lends its shape, dtype and device
        check_round(self.lane, KVCache(self.cache.k[:len(slots)], self.cache.v[:len(slots)]),
                    inputs)

    def _run(self, full: RoundInputs) -> DraftOutput:
        bucket = full.features.shape[0]
        k_cache, v_cache = self.cache.k[:bucket], self.cache.v[:bucket]
        features, num_new, anchor, anchor_pos, temperature, seed = full.tensors()
        if features.shape[1] != self.lane.k + 1:  # prefill: append the prompt eagerly
            self.drafter.append_context(k_cache, v_cache, features, num_new, anchor_pos)
            features = features.new_zeros(bucket, self.lane.k + 1, features.shape[2])
            num_new = torch.zeros_like(num_new)
        return DraftOutput(*self.steps[bucket](k_cache, v_cache, features, num_new, anchor,
                                               anchor_pos, temperature, seed))

    @torch.no_grad()
    def warm_up(self) -> None:
        """One all-inert round per bucket, so compiling (or loading) happens now rather than
        in the first real round. Inert rows write only scratch slots."""
        lane, device = self.lane, self.device
        for bucket in self.buckets:
            zeros = torch.zeros(bucket, dtype=torch.long, device=device)
            self._run(RoundInputs(
                torch.zeros(bucket, lane.k + 1, lane.feature_size, dtype=lane.torch_dtype,
                            device=device), zeros, zeros, zeros + self.max_context))


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
    steps = get_backend(manifest["backend"]).load(
        directory, DraftStep(drafter, manifest["with_probs"]), manifest["buckets"])
    runner = Runner(manifest, drafter, steps, device)
    runner.warm_up()
    return runner
