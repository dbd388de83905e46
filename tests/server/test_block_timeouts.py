"""Blocked commands' timeouts: one loop timer for all (waiters.BlockDeadlines)."""

from __future__ import annotations

import threading
import time

from disque.waiters import BlockDeadlines, Blocked, Waiter
from tests.support.process import DisqueProcess, wait_for


class _Client(Waiter):
    def resume(self, reply: object) -> None:
        pass


def test_deadlines_come_out_earliest_first_and_leave_in_any_order() -> None:
    deadlines = BlockDeadlines()
    late, early, middle, gone = (Blocked(_Client()) for _ in range(4))
    deadlines.add(late, 3000)
    deadlines.add(early, 50)
    deadlines.add(middle, 100)
    deadlines.add(gone, 40)
    assert deadlines.next_deadline() == 40
    deadlines.discard(gone)
    assert gone.deadline == 0 and len(deadlines) == 3
    assert deadlines.next_deadline() == 50
    assert deadlines.pop_due(49) == []
    # 50 and 100 share no bucket with 3000; 100 is not due at 99 though
    # its bucket (96-111) is open.
    assert deadlines.pop_due(99) == [early]
    assert deadlines.next_deadline() == 100
    assert deadlines.pop_due(100) == [middle]
    assert deadlines.pop_due(10**9) == [late]
    assert (len(deadlines), deadlines.next_deadline(), late.deadline) == (0, 0, 0)


def test_answered_commands_leave_no_bucket_numbers_behind() -> None:
    deadlines = BlockDeadlines()
    for step in range(20_000):
        blocked = Blocked(_Client())
        deadlines.add(blocked, 100 + 16 * step)  # a bucket each
        deadlines.discard(blocked)
    assert len(deadlines) == 0 and deadlines.next_deadline() == 0
    assert deadlines.numbers_held <= 1024


def _timed_getjob(server: DisqueProcess, timeout_ms: int, out: dict[int, tuple[object, float]],
                  finished: list[int]) -> None:
    client = server.client()
    started = time.monotonic()
    reply = client.execute_command("GETJOB", "TIMEOUT", timeout_ms, "FROM", f"q{timeout_ms}")
    out[timeout_ms] = (reply, time.monotonic() - started)
    finished.append(timeout_ms)


def test_each_timeout_comes_on_time_whatever_order_they_were_made_in(
        server: DisqueProcess) -> None:
    """A later GETJOB with an earlier deadline moves the one timer forward."""
    r = server.client()
    out: dict[int, tuple[object, float]] = {}
    finished: list[int] = []
    threads = []
    for count, timeout_ms in enumerate((900, 300, 600), start=1):
        thread = threading.Thread(target=_timed_getjob, args=(server, timeout_ms, out, finished))
        thread.start()
        threads.append(thread)
        wait_for(lambda n=count: r.info("clients")["blocked_clients"] == n, 5,
                 message=f"{count} clients blocked")
    for thread in threads:
        thread.join(10)
    assert finished == [300, 600, 900]
    for timeout_ms, (reply, elapsed) in out.items():
        assert reply is None
        assert elapsed >= timeout_ms / 1000, f"TIMEOUT {timeout_ms} ended after {elapsed:.3f} s"
    assert r.info("clients")["blocked_clients"] == 0


def test_a_timeout_after_an_answered_command_still_comes(server: DisqueProcess) -> None:
    """The timer armed for a GETJOB that got a job fires with nothing due and
    is armed again for the next deadline."""
    r = server.client()
    out: dict[int, tuple[object, float]] = {}
    finished: list[int] = []
    first = threading.Thread(target=_timed_getjob, args=(server, 200, out, finished))
    first.start()
    wait_for(lambda: r.info("clients")["blocked_clients"] == 1, 5, message="GETJOB blocked")
    job_id = r.execute_command("ADDJOB", "q200", "body", 0)
    first.join(5)
    assert out[200][0][0][1] == job_id  # type: ignore[index]
    second = threading.Thread(target=_timed_getjob, args=(server, 500, out, finished))
    second.start()
    second.join(10)
    reply, elapsed = out[500]
    assert reply is None and elapsed >= 0.5
    assert finished == [200, 500]
    assert r.info("clients")["blocked_clients"] == 0
