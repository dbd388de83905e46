"""``disque.clock`` as a unit: the node's milliseconds and the requeue jitter.

The clock reads the monotonic clock as float seconds and adds an offset
kept in step with the nanosecond one (the stepped-clock behaviour itself is
tested with faketime in tests/faults); the jitter comes from a small
generator of its own.  Both must keep what callers rely on.
"""

from __future__ import annotations

import itertools
import time

import pytest

from disque.clock import Clock, random_time_error


def test_now_ms_is_the_wall_clock_in_milliseconds() -> None:
    clock = Clock()
    for _ in range(1000):
        before = time.time_ns() // 1_000_000
        now = clock.now_ms()
        after = time.time_ns() // 1_000_000
        # One millisecond of slack: the offset was read from two clocks at
        # two instants, and float and integer milliseconds round apart.
        assert before - 1 <= now <= after + 1
        assert type(now) is int


def test_now_ms_never_goes_back_and_follow_wall_keeps_it() -> None:
    clock = Clock()
    last = clock.now_ms()
    for i in range(20_000):
        if i % 5000 == 0:
            assert abs(clock.follow_wall()) <= 1  # the system clock was not stepped
        now = clock.now_ms()
        assert now >= last
        last = now
    assert abs(clock.skew_ms()) <= 1


@pytest.mark.parametrize("span", [500, 7, 2, 1])
def test_jitter_covers_its_span_evenly(span: int) -> None:
    draws = [random_time_error(span) for _ in range(200 * span)]
    low, high = -(span // 2), span - span // 2 - 1
    assert set(draws) == set(range(low, high + 1))
    counts = [draws.count(value) for value in range(low, high + 1)]
    assert max(counts) < 2 * min(counts)


def test_jitter_is_not_a_short_cycle() -> None:
    """Successive draws are not a repeating pattern (an LCG's low bits are;
    the jitter takes the high ones)."""
    draws = [random_time_error(500) for _ in range(2000)]
    pairs = set(itertools.pairwise(draws))
    assert len(pairs) > 1900
    parity = [d & 1 for d in draws]
    assert parity[:1000] != parity[1000:] and 400 < sum(parity[:1000]) < 600
