"""Paths checked token by token against the host path (the oracle): the eager device path
and artifacts' runners, drafting the same rounds on the same bucket-sized batch. The main
command's table, the benchmark and dspark-verify all compare through this module."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from dspark_compile.compile.backends import get_backend
from dspark_compile.draft import DraftOutput, HostPath, HostResult, KVCache, RoundInputs, draft
from dspark_compile.model import Drafter
from dspark_compile.runtime import Runner
from dspark_compile.tools.timing import timed

HOST = "host"
EAGER = "device (eager)"


def runtime_path(backend: str) -> str:
    return f"runtime ({backend})"


@dataclass
class Agreement:
    """One path against the host path, over the rounds checked so far: ids exactly,
    confidences within ``confidence_tolerance`` (0 unless a backend's GEMMs round
    differently from torch's)."""

    confidence_tolerance: float = 0.0
    identical: bool = True
    tokens_compared: int = 0
    first_mismatch: Optional[dict[str, Any]] = None

    def check(self, out: DraftOutput, ref: HostResult, rows: Tensor, **where: int) -> bool:
        """Whether ``out`` (the requests' outputs, in order) agrees with the host path's
        rows ``rows``; the first mismatch is kept, with ``where`` (round, bucket)."""
        ids, host_ids = out.ids.cpu(), ref.ids[rows]
        # a drafter without a confidence head has none on every path: NaNs would not compare
        confidences, host_confidences = (
            torch.full(ids.shape, -1.0) if c is None else c.cpu()
            for c in (out.confidences, None if ref.confidences is None
                      else ref.confidences[rows]))
        same = (ids == host_ids) & (
            (confidences - host_confidences).abs() <= self.confidence_tolerance)
        self.tokens_compared += ids.numel()
        if bool(same.all()):
            return True
        if self.identical:
            row, step = (int(i) for i in (~same).nonzero()[0])
            self.first_mismatch = {
                **where, "row": row, "step": step, "id": int(ids[row, step]),
                "host_id": int(host_ids[row, step]),
                "confidence": float(confidences[row, step]),
                "host_confidence": float(host_confidences[row, step])}
        self.identical = False
        return False


class Comparison:
    """Rounds for ``batch`` requests through the host path of ``drafter`` and the paths
    compared with it: the eager device path (with ``eager``) and each runner (by backend).
    Host and eager paths draft the runners' bucket-sized layout of each round, inert rows
    included, so every path runs the same shapes. The runners must draft with
    ``drafter``'s weights and share their buckets; each admits ``batch`` slots here
    (``release`` frees them). A round's features are cast to ``drafter``'s dtype."""

    def __init__(self, drafter: Drafter, batch: int, runners: dict[str, Runner],
                 eager: bool = True):
        self.drafter, self.runners, self.batch = drafter, runners, batch
        self.device = drafter.fc.weight.device
        self.slots = {name: [runner.admit() for _ in range(batch)]
                      for name, runner in runners.items()}
        layouts = {(runner.bucket(batch), tuple(map(runner.row_of, self.slots[name])))
                   for name, runner in runners.items()}
        if len(layouts) > 1:
            raise ValueError(f"runners that lay the requests out differently: {layouts}")
        self.bucket = layouts.pop()[0] if layouts else batch
        self.host = HostPath(drafter)
        lane = drafter.lane
        # caches of the runners' size: attention sums over every slot, so a cache of another
        # size could round the confidences another way
        self.host_cache = KVCache.allocate(lane, self.bucket, self.device)
        self.eager_cache = KVCache.allocate(lane, self.bucket, self.device) if eager else None
        self.agreement = {EAGER: Agreement()} if eager else {}
        for backend, runner in runners.items():
            tolerance = getattr(get_backend(runner.manifest["backend"]),
                                "CONFIDENCE_TOLERANCE", 0.0)
            self.agreement[runtime_path(backend)] = Agreement(tolerance)
        self.near_ties = 0  # greedy near-ties the host path met in the requests' rows

    def calls(self, inputs: RoundInputs) -> tuple[dict[str, Callable[[], Any]], Tensor]:
        """Each path's call of the round ``inputs`` (the host path's first; it returns a
        :class:`HostResult`, the others a :class:`DraftOutput` of the requests), and the
        requests' rows of the host path's outputs."""
        dtype = self.drafter.lane.torch_dtype
        if inputs.features.dtype != dtype:
            inputs = dataclasses.replace(inputs, features=inputs.features.to(dtype))
        if self.runners:
            name, runner = next(iter(self.runners.items()))
            full, rows = runner.layout(inputs, self.slots[name])
        else:
            full, rows = inputs, torch.arange(self.batch, device=self.device)
        calls: dict[str, Callable[[], Any]] = {
            HOST: lambda: self.host.draft(self.host_cache, full)}
        if self.eager_cache is not None:
            calls[EAGER] = lambda: draft(self.drafter, self.eager_cache, full).select(rows)
        for backend, runner in self.runners.items():
            calls[runtime_path(backend)] = (
                lambda runner=runner, slots=self.slots[backend]: runner.draft(inputs, slots))
        return calls, rows.cpu()

    def round(self, inputs: RoundInputs, ms: Optional[dict[str, list[float]]] = None,
              **where: int) -> HostResult:
        """One round through every path, each checked against the host path; with ``ms``,
        each path's wall time is appended to its list. Returns the host path's result."""
        calls, rows = self.calls(inputs)
        ref: Optional[HostResult] = None
        for name, call in calls.items():
            out, elapsed = timed(call, self.device)
            if ms is not None:
                ms.setdefault(name, []).append(elapsed)
            if ref is None:
                ref = out
            else:
                self.agreement[name].check(out, ref, rows, **where)
        self.near_ties += int(ref.near_ties[rows].sum())
        return ref

    def release(self) -> None:
        for name, runner in self.runners.items():
            for slot in self.slots[name]:
                runner.release(slot)
