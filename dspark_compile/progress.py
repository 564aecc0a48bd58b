"""Progress of a long build: each phase with the time since the build began, as a line on
stderr (a log), or as one status line redrawn in place on a terminal."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from contextvars import ContextVar
from typing import Iterator, Optional, TextIO

from tqdm import tqdm

_current: ContextVar[Optional["Progress"]] = ContextVar("progress", default=None)
_interrupted = threading.Event()


def interrupt(signum: int, frame: object) -> None:
    """A SIGINT handler (the CLI's): Ctrl-C as KeyboardInterrupt, and remembered, so that
    the build's next phase raises it again where a compiler's own code swallowed it."""
    _interrupted.set()
    raise KeyboardInterrupt


class Progress:
    def __init__(self, what: str, stream: TextIO):
        self.what, self.stream, self.start = what, stream, time.perf_counter()
        self.part = ""  # the part of the build its phases belong to, as "bucket 8 (2/3): "
        self.bar = (tqdm(file=stream, bar_format="{desc} [{elapsed}]", leave=False)
                    if stream.isatty() else None)

    def phase(self, name: str) -> None:
        name = self.part + name
        if self.bar is not None:
            self.bar.set_description_str(f"{self.what}: {name}")
        else:
            seconds = time.perf_counter() - self.start
            print(f"{self.what}: [{seconds:6.1f} s] {name}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def reporting(what: str, stream: Optional[TextIO] = None) -> Iterator[Progress]:
    """Phases reported inside this block (:func:`phase`) go to ``stream`` (default: the
    process's stderr at the time)."""
    progress = Progress(what, stream or sys.stderr)
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)
        progress.close()


def phase(name: str) -> None:
    """Report a phase of the build in progress, if one is reporting (after an interrupt:
    raise it)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt
    progress = _current.get()
    if progress is not None:
        progress.phase(name)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Phases reported inside this block name the part of the build they belong to."""
    progress = _current.get()
    if progress is None:
        yield
        return
    progress.part = f"{name}: "
    try:
        yield
    finally:
        progress.part = ""
