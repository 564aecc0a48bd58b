"""When rows freed by finished requests take the next ones. A refill is one prefill of the
new prompts through the target. Where that costs about the same whatever its prompts (a
latency-bound target: one small prompt's prefill can cost a few passes), one prefill of
many prompts costs less than many of one, and rows left free a few passes cost less than
the prefills they save. Speculative rounds finish requests a few rows at a time, so
refilling at once runs a prefill nearly every round."""

from __future__ import annotations

from dspark_compile.errors import ConfigError


class Refills:
    """Free rows wait until their idle passes, summed over the rows, reach ``wait`` passes
    of every row (``wait`` * rows), then all are refilled in one prefill: ski rental, with
    ``wait`` the prefill's cost in passes, the rows' idle time costs at most one prefill's
    before each refill. ``wait`` 0: at once. Rows are refilled at once where no row is
    busy or the queue holds no more requests than there are rows free (waiting batches
    nothing more)."""

    def __init__(self, rows: int, wait: float = 0.0):
        if wait < 0:
            raise ConfigError(f"refill_wait={wait}: expected 0 (at once) or more passes")
        self.rows, self.wait = rows, wait
        self.freed: dict[int, int] = {}  # a free row -> the pass count when it was freed

    def free(self, rows: list[int], passes: int) -> None:
        """``rows`` are free after ``passes`` passes."""
        for row in rows:
            self.freed[row] = passes

    def due(self, passes: int, busy: int, queued: int) -> list[int]:
        """The free rows to refill now, in the order they were freed (none to wait), after
        ``passes`` passes, with ``busy`` rows serving requests and ``queued`` waiting."""
        if not self.freed or not queued:
            return []
        idle = sum(passes - freed for freed in self.freed.values())
        if busy and queued > len(self.freed) and idle < self.wait * self.rows:
            return []
        chosen = list(self.freed)[:queued]
        for row in chosen:
            del self.freed[row]
        return chosen
