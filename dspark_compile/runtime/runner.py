"""The runner: slots for requests that come and go, one KV cache, and one bound draft step
per batch bucket."""

from __future__ import annotations

import bisect
import contextlib
import threading
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftOutput, KVCache, PrefillStep, RoundInputs
from dspark_compile.draft.checks import RULES, check_input_shapes, check_rules
from dspark_compile.draft.inputs import greedy_defaults
from dspark_compile.errors import ConfigError, InputError, RunnerBusyError
from dspark_compile.model import Drafter
from dspark_compile.runtime.capture import bind, byte_views, copy_into, host_views, packed
from dspark_compile.runtime.schedule import (LaggedSchedule, StepsPerSecond, scheduler,
                                              with_lengths)
from dspark_compile.runtime.transfer import download, upload


class Runner:
    """Drafts with one artifact, for requests that come and go.

    ``admit()`` gives a request a slot; ``draft(inputs, slots)`` drafts one round for some
    admitted slots (row i of ``inputs`` belongs to ``slots[i]``); ``release(slot)`` frees
    it. Each slot owns one row of the runner's KV cache, which holds as many rows as the
    largest bucket. Rows are kept dense: releasing a slot moves the last row into the hole,
    so a round always runs the smallest bucket that covers every admitted slot. Rows that
    take no part in a round are inert: no new context, and an anchor at the context
    capacity, so their block K/V land in scratch slots only and their outputs are dropped.

    Each bucket's step is bound to fixed buffers (the first rows of the cache and six
    input tensors): a round copies its inputs in and, on a GPU, replays one CUDA graph
    captured here around the backend's step. Only ids, confidences and the rules vector come
    back to the host, packed on the device into one copy to a pinned buffer; the tensors
    ``draft`` returns are the caller's to keep, but q (``probs``), which stays on the device
    and is read within the round, lasts until the next round only.
    A round whose features do not have k+1 rows (a prompt) is first appended eagerly
    (prefill), then the bound step runs with no new rows.

    ``schedule(sps)`` adds the verify lengths to every round (``DraftOutput.lengths``),
    inside the same graph and download.

    Threading: a runner is not thread-safe. A call made while another thread is inside
    the same runner raises :class:`RunnerBusyError` instead of waiting or corrupting state;
    use one runner per thread, or serialise the calls.
    """

    def __init__(self, manifest: dict, drafter: Drafter, steps: dict[int, Callable],
                 device: torch.device, capture: bool):
        self.manifest = manifest
        self.load_seconds: dict[str, float] = {}  # load_runner's phases
        self.lane: LaneConfig = drafter.lane
        self.drafter = drafter
        self._prefill = PrefillStep(drafter)  # a prompt round's append, eager
        self.buckets = sorted(steps)
        self.device = device
        self.cache = KVCache.allocate(self.lane, self.buckets[-1], device)
        self.max_context = self.cache.k.shape[3] - self.lane.block_rows - 1
        self._rows: dict[int, int] = {}  # slot -> cache row; rows 0..len-1 are taken
        self._next_slot = 0
        self._busy = threading.Lock()
        self._steps, self._capture = steps, capture
        self._inputs: dict[int, tuple[Tensor, ...]] = {}
        self._input_bytes: dict[int, list[Tensor]] = {}
        # per bucket, for schedule(): the rows in the round, and SPS by tokens in a step
        self._live = {b: torch.zeros(b, dtype=torch.bool, device=device) for b in self.buckets}
        self._rates = {b: torch.zeros(b * (self.lane.k + 1) + 1, dtype=torch.float64,
                                      device=device) for b in self.buckets}
        self.schedule_by: Optional[str] = None  # how schedule()'s target charges a step
        self._lagged: Optional[LaggedSchedule] = None  # schedule(sps, lag > 0)
        self._calls: dict[int, Callable[[], tuple[Tensor, ...]]] = {}
        # per bucket: one pinned byte buffer, and the ids, confidences, rules kept and
        # lengths (when scheduled) in it
        self._host: dict[int, tuple[Tensor, ...]] = {}
        self._defaults: dict[int, tuple[Tensor, Tensor]] = {}  # requests -> (T, seed) zeros
        for bucket in self.buckets:
            self._inputs[bucket] = self._inert(bucket)
            self._input_bytes[bucket] = byte_views(self._inputs[bucket])
        self._bind()

    @torch.no_grad()
    def _bind(self) -> None:
        """Each bucket's call on its buffers: the step, and Algorithm 1 after it when
        scheduled; ids, confidences, the rules kept (and lengths) come back in one
        download."""
        pool = torch.cuda.graph_pool_handle() if self._capture else None  # buckets share it
        for bucket in self.buckets:
            args = (self.cache.k[:bucket], self.cache.v[:bucket], *self._inputs[bucket])
            step = self._steps[bucket]
            if self.scheduled:
                step = with_lengths(step, scheduler(self.schedule_by))
                args = (*args, self._live[bucket], self._rates[bucket])
            self._calls[bucket] = bind(packed(step, 3 + self.scheduled), args,
                                       self._capture, pool)
            self._host[bucket] = self._downloads(bucket, self.device.type == "cuda")

    def schedule(self, sps: Optional[StepsPerSecond], lag: int = 0) -> None:
        """From now on each round also returns its verify lengths (``DraftOutput.lengths``,
        0 .. k per request) over ``sps``, the target's verify steps per second
        (``sps.lengths``: Algorithm 1, or the width schedule): ``lag`` 0, over the round's
        confidences in its own graph; ``lag`` > 0, over each request's of that many rounds
        before, on the host (:class:`~dspark_compile.runtime.schedule.LaggedSchedule`).
        None: no lengths again."""
        if sps is not None and not self.lane.confidence_head:
            raise ConfigError("schedule: the drafter has no confidence head to schedule by")
        if lag < 0:
            raise ConfigError(f"schedule: lag={lag}, expected 0 or more rounds")
        with self._exclusive():
            self._lagged = None if sps is None or not lag else LaggedSchedule(
                sps, lag, self.lane.k, self.buckets[-1])
            if sps is not None and not lag:
                for bucket, rates in self._rates.items():
                    rates.copy_(sps.table(len(rates) - 1, self.device))
            by = None if sps is None or lag else sps.by
            if self.schedule_by != by:
                self.schedule_by = by
                self._bind()

    @property
    def scheduled(self) -> bool:
        return self.schedule_by is not None

    def _downloads(self, bucket: int, pinned: bool) -> tuple[Tensor, ...]:
        """The bucket's pinned host buffer and its ids, confidences, rules kept (and
        lengths), in the order :func:`packed` lays them out."""
        k = self.lane.k
        host, (ids, *lengths, confidences, kept) = host_views(
            [((bucket, k), torch.long), *[((bucket,), torch.long)] * self.scheduled,
             ((bucket, k), torch.float32), ((len(RULES),), torch.bool)], pinned)
        return (host, ids, confidences, kept, *lengths)

    def _inert(self, bucket: int) -> tuple[Tensor, ...]:
        lane, device = self.lane, self.device
        zeros = torch.zeros(bucket, dtype=torch.long, device=device)
        features = torch.zeros(bucket, lane.k + 1, lane.feature_size, dtype=lane.torch_dtype,
                               device=device)
        return RoundInputs(features, zeros, zeros.clone(), zeros + self.max_context).tensors()

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
            row = self.row_of(slot)
            del self._rows[slot]
            if self._lagged is not None:
                self._lagged.forget(slot)
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
        rows = upload([self.row_of(s) for s in slots], self.device)
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
        """One round for ``slots``: ids and confidences on the host, in the order of
        ``slots`` (q, when the artifact has it, stays on the device until the next round:
        where the round is the whole bucket in order it is the step's own output, not a
        copy of ``[R, k, V]`` floats)."""
        with self._exclusive():
            rows = self._check(inputs, slots)
            inputs = self._with_defaults(inputs)
            bucket = self.bucket(len(self._rows))
            if rows == list(range(bucket)):
                # the whole bucket in row order: nothing to lay out or pick
                if self.scheduled:
                    self._live[bucket].fill_(True)
                out = self._run(inputs, inputs, None)
            else:
                full, placed = self.layout(inputs, slots)
                if self.scheduled:
                    self._live[bucket].zero_().index_fill_(0, placed, True)
                out = self._run(full, inputs, torch.tensor(rows))
            if self._lagged is not None:
                out.lengths = self._lagged(slots, out.confidences)
            return out

    @torch.no_grad()
    def replay(self, batch: int) -> None:
        """The bound step of ``batch``'s bucket alone, on what its buffers hold (the
        bucket's last round, again: the same rows at the same positions): one CUDA-graph
        replay on a GPU, no inputs copied in, nothing downloaded. What a round costs on the
        device, for timing against :meth:`draft`."""
        with self._exclusive():
            self._calls[self.bucket(batch)]()

    def download_bytes(self, batch: int) -> int:
        """Bytes a round of ``batch`` requests copies to the host: its bucket's ids,
        confidences and rules kept, in one download."""
        return self._host[self.bucket(batch)][0].numel()

    def _check(self, inputs: RoundInputs, slots: Sequence[int]) -> list[int]:
        """The slots' rows, once the slots and the inputs' shapes are checked."""
        if not isinstance(slots, Sequence) or not slots:
            raise InputError("slots", repr(slots), "a non-empty sequence of admitted slots")
        rows = [self.row_of(slot) for slot in slots]
        if len(set(slots)) != len(slots):
            raise InputError("slots", f"{list(slots)} repeats a slot", "distinct slots")
        features = inputs.features
        if isinstance(features, Tensor) and features.dim() == 3 \
                and features.shape[0] != len(slots):
            raise InputError("features", f"{features.shape[0]} rows for {len(slots)} slots",
                             "one row per slot")
        # shapes here, values by the step itself (_run)
        check_input_shapes(self.lane, inputs, self.cache.k.device)
        return rows

    def _with_defaults(self, inputs: RoundInputs) -> RoundInputs:
        """``inputs`` with a default temperature and seed (zeros) that the runner keeps, so
        that a round allocates and fills nothing for them."""
        if inputs.temperature is not None and inputs.seed is not None:
            return inputs
        rows = inputs.anchor.shape[0]
        if rows not in self._defaults:
            self._defaults[rows] = greedy_defaults(rows, self.device)
        temperature, seed = self._defaults[rows]
        return RoundInputs(
            inputs.features, inputs.num_new, inputs.anchor, inputs.anchor_pos,
            temperature if inputs.temperature is None else inputs.temperature,
            seed if inputs.seed is None else inputs.seed)

    def _run(self, full: RoundInputs, inputs: RoundInputs, rows: Optional[Tensor]
             ) -> DraftOutput:
        """One bucket-sized round ``full`` that holds the caller's ``inputs`` at the cache
        rows ``rows`` (None: all of them, in order); every output on the host except q.
        A round whose values break a rule of ``round_rules`` raises after it ran inert, so
        it changed no context (a prompt round's append too: it waits for nothing)."""
        bucket, slots = full.features.shape[0], self.cache.k.shape[-2]
        static = self._inputs[bucket]
        tensors = full.tensors()
        prompt_kept = None
        if full.features.shape[1] != self.lane.k + 1:  # prefill: append the prompt eagerly
            prompt_kept = download(self._prefill(self.cache.k[:bucket], self.cache.v[:bucket],
                                                 *tensors))
            tensors = (static[0], torch.zeros_like(full.num_new), *tensors[2:])
        copy_into(static, tensors, self._input_bytes[bucket])
        outputs = self._calls[bucket]()
        host, ids, confidences, kept, *lengths = self._host[bucket]
        host.copy_(outputs[0], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        if prompt_kept is not None:
            check_rules(self.lane, slots, inputs, prompt_kept.tolist())
        check_rules(self.lane, slots, inputs, kept.tolist())
        probs = outputs[1] if len(outputs) > 1 else None
        if not self.lane.confidence_head:  # the drafter has none: the step's NaNs stay
            confidences = None
        lengths = lengths[0] if lengths else None
        if rows is None:  # copies: the buffers are the next round's (q: see draft)
            return DraftOutput(ids.clone(), _copy(confidences), probs, _copy(lengths))
        return DraftOutput(ids[rows], None if confidences is None else confidences[rows],
                           None if probs is None else probs[upload(rows, probs.device)],
                           None if lengths is None else lengths[rows])


def _copy(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.clone()
