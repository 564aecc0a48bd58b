"""When freed rows take the next requests (``Refills``): at once, or together once their
idle passes add up to the wait."""

import pytest

from dspark_compile.errors import ConfigError
from dspark_compile.speculative.refill import Refills


def test_at_once_every_freed_row_is_refilled_in_the_order_freed_up_to_the_queue():
    refills = Refills(rows=4)
    refills.free([3, 1], passes=5)
    assert refills.due(passes=5, busy=2, queued=9) == [3, 1]
    refills.free([2, 0], passes=6)
    assert refills.due(passes=6, busy=2, queued=1) == [2]  # one request left for two rows
    assert refills.due(passes=7, busy=2, queued=0) == []


def test_rows_wait_until_their_idle_passes_add_up_to_the_wait_of_every_row():
    refills = Refills(rows=4, wait=1.0)  # 4 idle row-passes
    refills.free([2], passes=10)
    assert refills.due(passes=10, busy=3, queued=5) == []
    assert refills.due(passes=13, busy=3, queued=5) == []  # 3 idle row-passes
    refills.free([0], passes=13)
    assert refills.due(passes=13, busy=2, queued=5) == []  # 3
    assert refills.due(passes=14, busy=2, queued=5) == [2, 0]  # 4 + 1
    assert refills.due(passes=20, busy=2, queued=3) == []  # nothing free


def test_rows_are_refilled_at_once_where_waiting_batches_nothing_more():
    refills = Refills(rows=4, wait=100.0)
    refills.free([1], passes=3)
    assert refills.due(passes=3, busy=3, queued=2) == []
    refills.free([0], passes=3)
    assert refills.due(passes=3, busy=2, queued=2) == [1, 0]  # the queue fits the free rows
    refills.free([2, 3], passes=4)
    assert refills.due(passes=4, busy=0, queued=9) == [2, 3]  # no row busy: nothing to wait on


def test_a_negative_wait_is_refused():
    with pytest.raises(ConfigError, match="refill_wait"):
        Refills(rows=2, wait=-1.0)
