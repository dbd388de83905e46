"""Jobs with BACKOFF / MAXDELIVERIES / DEADLETTER in the AOF: their options, and
a dead-letter move, survive a crash and a rewrite (docs/EXTENSIONS.md)."""

from __future__ import annotations

import subprocess
import sys

from tests.persistence.conftest import aof_file, crash_and_restart, show
from tests.support.process import wait_for

OPTION_FIELDS = (b"backoff", b"max-deliveries", b"dead-letter-queue", b"dead-lettered-from")


def options_of(info: dict) -> tuple:
    return tuple(info[k] for k in OPTION_FIELDS)


def test_options_and_a_dead_letter_move_survive_crash_and_rewrite(aof_node) -> None:
    r = aof_node.client()
    waiting = r.execute_command("ADDJOB", "q", "waiting", 0, "RETRY", 30, "BACKOFF", 600,
                                "MAXDELIVERIES", 5, "DEADLETTER", "graveyard")
    moved = r.execute_command("ADDJOB", "q", b"moved \x00\xff", 0, "RETRY", 1,
                              "MAXDELIVERIES", 1)
    plain = r.execute_command("ADDJOB", "q", "plain", 0, "RETRY", 30)
    assert r.execute_command("GETJOB", "FROM", "q")[0][1] == waiting
    assert r.execute_command("GETJOB", "FROM", "q")[0][1] == moved
    assert r.execute_command("NACK", moved) == 1   # the limit: moved to q:dead
    assert show(r, moved)[b"queue"] == b"q:dead"

    for restart in ("crash", "rewrite then crash"):
        if restart == "rewrite then crash":
            r.execute_command("BGREWRITEAOF")
            wait_for(lambda r=r: r.info("persistence")["aof_rewrite_in_progress"] == 0, timeout=20,
                     message="the rewrite to end")
        r = crash_and_restart(aof_node)
        info = show(r, waiting)
        assert options_of(info) == (600, 5, b"graveyard", None), restart
        info = show(r, moved)
        assert info[b"queue"] == b"q:dead" and info[b"body"] == b"moved \x00\xff", restart
        assert options_of(info) == (0, 1, b"q:dead", b"q"), restart
        assert info[b"nacks"] == 1, restart
        assert b"backoff" not in show(r, plain), restart  # a plain job stays plain

    # The moved job comes back in the dead-letter queue, never in its first one.
    wait_for(lambda: r.execute_command("QLEN", "q:dead") == 1, timeout=10,
             message="the reloaded dead letter to be requeued")
    assert r.execute_command("GETJOB", "FROM", "q:dead")[0][1] == moved
    report = subprocess.run([sys.executable, "-m", "disque.aof.check", str(aof_file(aof_node))],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stdout + report.stderr


def test_priorities_survive_crash_and_rewrite_and_keep_their_order(aof_node) -> None:
    """Reloaded jobs are queued again after their RETRY: the highest priority
    comes out first, as before the crash."""
    r = aof_node.client()
    ids = {body: r.execute_command("ADDJOB", "pq", body, 0, "RETRY", 1,
                                   *(("PRIORITY", p) if p else ()))
           for body, p in (("plain", 0), ("low", 2), ("top", 30), ("low2", 2))}
    for restart in ("crash", "rewrite then crash"):
        if restart == "rewrite then crash":
            r.execute_command("BGREWRITEAOF")
            wait_for(lambda r=r: r.info("persistence")["aof_rewrite_in_progress"] == 0,
                     timeout=20, message="the rewrite to end")
        r = crash_and_restart(aof_node)
        assert show(r, ids["top"])[b"priority"] == 30, restart
        assert b"priority" not in show(r, ids["plain"]), restart
        wait_for(lambda r=r: r.execute_command("QLEN", "pq") == 4, timeout=10,
                 message="the reloaded jobs to be queued again")
        peek = [entry[2] for entry in r.execute_command("QPEEK", "pq", 10)]
        assert peek == [b"top", b"low", b"low2", b"plain"], restart
