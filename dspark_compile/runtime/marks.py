"""Points in a stream's time that do not wait for the stream, so a loop can time its phases
without the synchronisations that would change what it times."""

from __future__ import annotations

import time

import torch


class StreamMark:
    """A point in the stream's time: a CUDA event on a GPU (read after the run), else the
    host clock (where each call returns when its work is done)."""

    def __init__(self, device: torch.device):
        self.event = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        if self.event is not None:
            self.event.record()
        self.host = time.perf_counter()

    def seconds_to(self, later: "StreamMark") -> float:
        if self.event is None:
            return later.host - self.host
        return self.event.elapsed_time(later.event) / 1e3

    def wait(self) -> None:
        """Return once the stream has done everything queued before this mark."""
        if self.event is not None:
            self.event.synchronize()
