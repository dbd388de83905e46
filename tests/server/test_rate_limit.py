"""QLIMIT (per-queue rate limits, an extension) on a real node: the window,
blocked consumers woken when it opens without the node spinning, the
command's forms and errors, QSTAT, persistence (docs/EXTENSIONS.md,
"Rate limits")."""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from disque.queue_limit import QueueLimit
from tests.server.test_bad_input import HUGE, NOT_INTS, arg_id, assert_error_no_new_jobs
from tests.server.test_protocol_raw import Resp, pack
from tests.support.process import DisqueProcess, wait_for


def pairs(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(*[iter(reply)] * 2, strict=True))


# --------------------------------------------------------------------------
# The window's arithmetic, as a plain object
# --------------------------------------------------------------------------

def test_fixed_windows_count_deliveries() -> None:
    limit = QueueLimit(3, 1000)
    assert limit.left(0) == 3
    assert limit.take(100, 2) == 2      # opens [100, 1100)
    assert limit.left(500) == 1
    assert limit.take(600, 5) == 1 and limit.limited == 1
    assert limit.take(1099, 1) == 0 and limit.limited == 2
    assert limit.left(1100) == 3        # the window ended
    assert limit.take(5000, 1) == 1 and limit.window_end == 6000


# --------------------------------------------------------------------------
# On a node
# --------------------------------------------------------------------------

@pytest.fixture
def c(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as conn:
        conn.call("DEBUG", "FLUSHALL")
        yield conn
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"


def fill(c: Resp, queue: str, n: int) -> None:
    c.send(b"".join(pack("ADDJOB", queue, f"j{i}", 0) for i in range(n)))
    for _ in range(n):
        assert c.read().startswith(b"D-")


def test_getjob_delivers_at_most_max_per_window(c: Resp) -> None:
    assert c.call("QLIMIT", "rl", 3, 60_000) == b"OK"
    assert c.call("QLIMIT", "rl") == [3, 60_000]
    fill(c, "rl", 10)
    assert len(c.call("GETJOB", "COUNT", 2, "FROM", "rl")) == 2
    assert len(c.call("GETJOB", "NOHANG", "COUNT", 5, "FROM", "rl")) == 1  # the third
    assert c.call("GETJOB", "NOHANG", "FROM", "rl") is None  # the window is full
    assert c.call("QLEN", "rl") == 7                         # nothing lost
    stat = pairs(c.call("QSTAT", "rl"))
    assert stat[b"rate-limit"] == [3, 60_000]
    assert stat[b"rate-limit-left"] == 0 and stat[b"rate-limited"] == 2
    # Another queue of the same GETJOB is served; the limited one is skipped.
    c.call("ADDJOB", "free", "f", 0)
    got = c.call("GETJOB", "NOHANG", "COUNT", 5, "FROM", "rl", "free")
    assert [e[0] for e in got] == [b"free"]
    # OFF lifts it at once.
    assert c.call("QLIMIT", "rl", "OFF") == b"OK"
    assert c.call("QLIMIT", "rl") is None
    assert b"rate-limit" not in pairs(c.call("QSTAT", "rl"))
    assert len(c.call("GETJOB", "NOHANG", "COUNT", 10, "FROM", "rl")) == 7


def test_a_queue_without_a_limit_shows_the_original_fields(c: Resp) -> None:
    c.call("ADDJOB", "plain", "x", 0)
    assert len(pairs(c.call("QSTAT", "plain"))) == 10
    assert c.call("QLIMIT", "plain") is None


def test_blocked_consumers_wake_when_the_window_opens(c: Resp, node: DisqueProcess) -> None:
    assert c.call("QLIMIT", "w", 1, 1500) == b"OK"
    fill(c, "w", 3)
    assert len(c.call("GETJOB", "FROM", "w")) == 1  # opens the window
    with Resp(node.port) as waiter:
        waiter.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "w"))
        wait_for(lambda: pairs(c.call("QSTAT", "w"))[b"blocked"] == 1, timeout=5,
                 message="the consumer to block")
        started = time.monotonic()
        got = waiter.read()
        waited = time.monotonic() - started
    assert len(got) == 1 and got[0][0] == b"w"
    assert waited < 2.0  # woken by the window, not by its 10 s timeout


def test_a_job_added_for_a_waiting_consumer_waits_for_the_window_too(
        c: Resp, node: DisqueProcess) -> None:
    """A job added to an empty queue a consumer waits on is not handed to it
    while the queue's window is used up: it is queued until the window opens."""
    assert c.call("QLIMIT", "h", 1, 1500) == b"OK"
    fill(c, "h", 1)
    assert len(c.call("GETJOB", "FROM", "h")) == 1  # the window's one job
    with Resp(node.port) as waiter:
        waiter.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "h"))
        wait_for(lambda: pairs(c.call("QSTAT", "h"))[b"blocked"] == 1, timeout=5,
                 message="the consumer to block")
        job_id = c.call("ADDJOB", "h", "late", 0)
        stat = pairs(c.call("QSTAT", "h"))
        assert (stat[b"len"], stat[b"blocked"]) == (1, 1)
        got = waiter.read()
    assert got == [[b"h", job_id, b"late"]]
    assert c.call("QLEN", "h") == 0


def test_a_limited_queue_is_not_evicted_and_off_on_an_unknown_queue(c: Resp) -> None:
    assert c.call("QLIMIT", "kept", 5, 1000) == b"OK"  # creates the queue, like PAUSE
    assert pairs(c.call("QSTAT", "kept"))[b"rate-limit"] == [5, 1000]
    assert c.call("QLIMIT", "never-seen", "OFF") == b"OK"
    assert c.call("QSTAT", "never-seen") is None


QLIMIT_MAX_ERROR = ("ERR QLIMIT max must be a number of jobs between 1 and 4294967295 "
                    "(PAUSE queue out stops a queue's output)")
QLIMIT_PERIOD_ERROR = "ERR QLIMIT period must be between 1 and 86400000 milliseconds"


@pytest.mark.parametrize(("args", "error"), [
    (("QLIMIT", "q", 0, 1000), QLIMIT_MAX_ERROR),
    (("QLIMIT", "q", -1, 1000), QLIMIT_MAX_ERROR),
    (("QLIMIT", "q", 2 ** 32, 1000), QLIMIT_MAX_ERROR),
    (("QLIMIT", "q", HUGE, 1000), QLIMIT_MAX_ERROR),
    *((("QLIMIT", "q", bad, 1000), QLIMIT_MAX_ERROR) for bad in NOT_INTS[:4]),
    (("QLIMIT", "q", 10, 0), QLIMIT_PERIOD_ERROR),
    (("QLIMIT", "q", 10, 86_400_001), QLIMIT_PERIOD_ERROR),
    *((("QLIMIT", "q", 10, bad), QLIMIT_PERIOD_ERROR) for bad in NOT_INTS[:4]),
    (("QLIMIT", "q", 10), "ERR syntax error"),
    (("QLIMIT", "q", 10, 1000, "BCASTX"), "ERR syntax error"),
    (("QLIMIT", "q", "OFF", "x"), "ERR syntax error"),
    (("QLIMIT",), "ERR wrong number of arguments for 'qlimit' command"),
], ids=arg_id)
def test_bad_limits_change_nothing(c: Resp, args: tuple, error: str) -> None:
    assert c.call("QLIMIT", "q", 7, 5000) == b"OK"
    assert_error_no_new_jobs(c, args, exact=error)
    assert c.call("QLIMIT", "q") == [7, 5000]  # the limit before stays


# --------------------------------------------------------------------------
# 50 blocked consumers: the rate holds, and the node sleeps while they wait
# --------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Consumers:
    """``n`` connections, each blocked in GETJOB on ``queue``; every job
    received is acked and the connection blocks again.  Driven from one
    thread with a selector (no thread per consumer)."""

    def __init__(self, port: int, queue: str, n: int) -> None:
        self.queue = queue
        self.selector = selectors.DefaultSelector()
        self.conns: list[Resp] = []
        self.deliveries: list[float] = []
        for _ in range(n):
            conn = Resp(port)
            conn.sock.setblocking(False)
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)
            self.conns.append(conn)
            self._get(conn)

    def _get(self, conn: Resp) -> None:
        conn.sock.setblocking(True)
        conn.send(pack("GETJOB", "FROM", self.queue))
        conn.sock.setblocking(False)

    def pump(self, seconds: float) -> None:
        """Serve replies for ``seconds``."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            for key, _ in self.selector.select(timeout=left):
                conn: Resp = key.data
                try:
                    chunk = conn.sock.recv(65536)
                except BlockingIOError:
                    continue
                assert chunk, "the node closed a consumer's connection"
                conn.buf += chunk
                while True:
                    try:
                        reply = parse_one(conn)
                    except _Incomplete:
                        break
                    if isinstance(reply, int):
                        continue  # the ACKJOB's count
                    assert reply and reply[0][0] == self.queue.encode(), reply
                    self.deliveries.append(time.monotonic())
                    conn.sock.setblocking(True)
                    conn.send(pack("FASTACK", reply[0][1]) + pack("GETJOB", "FROM", self.queue))
                    conn.sock.setblocking(False)

    def close(self) -> None:
        for conn in self.conns:
            self.selector.unregister(conn.sock)
            conn.close()
        self.selector.close()


class _Incomplete(Exception):
    pass


def parse_one(conn: Resp) -> Any:
    from tests.server.test_protocol_raw import frame_end, parse

    end = frame_end(conn.buf) if conn.buf else None
    if end is None:
        raise _Incomplete
    raw = bytes(conn.buf[:end])
    del conn.buf[:end]
    return parse(raw)


@pytest.mark.slow
def test_fifty_blocked_consumers_get_the_limit_and_the_node_stays_idle(
        server_factory) -> None:
    node = server_factory()
    with Resp(node.port) as c:
        max_jobs, period_ms, periods = 20, 500, 10
        fill(c, "busy", max_jobs * (periods + 6))
        assert c.call("QLIMIT", "busy", max_jobs, period_ms) == b"OK"
        consumers = Consumers(node.port, "busy", 50)
        try:
            consumers.pump(1.0)  # every consumer blocked, the first windows served
            consumers.deliveries.clear()
            consumers.pump(periods * period_ms / 1000)
        finally:
            consumers.close()
        # Each window is a burst (the consumers were blocked, all are served
        # when it opens) then a pause: a delivery after a pause opens a window.
        times = consumers.deliveries
        starts = [i for i in range(1, len(times)) if times[i] - times[i - 1] > period_ms / 2000]
        assert len(starts) >= periods - 2, (len(starts), len(times))
        sizes = [b - a for a, b in pairwise(starts)]
        assert sizes and all(size == max_jobs for size in sizes), sizes  # never more
        rate = sum(sizes) / (times[starts[-1]] - times[starts[0]])
        expected = max_jobs * 1000 / period_ms
        assert abs(rate - expected) <= 0.1 * expected, (rate, expected)

        # A long window: 5 jobs per 3 s.  After the first 5, the other 45
        # consumers wait; the node must sleep meanwhile (one timer for the
        # queue, no polling).
        fill(c, "idle", 100)
        assert c.call("QLIMIT", "idle", 5, 3000) == b"OK"
        waiting = Consumers(node.port, "idle", 50)
        try:
            waiting.pump(0.5)
            assert len(waiting.deliveries) == 5
            wait_for(lambda: pairs(c.call("QSTAT", "idle"))[b"blocked"] == 50, timeout=5,
                     message="all 50 consumers to block")
            cpu_before, wall_before = cpu_seconds(node.pid), time.monotonic()
            waiting.pump(1.5)
            cpu = cpu_seconds(node.pid) - cpu_before
            wall = time.monotonic() - wall_before
            assert len(waiting.deliveries) == 5  # still the same window
            assert cpu < 0.1 * wall, f"{cpu:.3f} s of CPU in {wall:.2f} s while consumers wait"
            waiting.pump(2.0)  # the next window opens: five more
            assert len(waiting.deliveries) == 10
        finally:
            waiting.close()
