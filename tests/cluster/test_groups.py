"""Ordered groups across real nodes (docs/EXTENSIONS.md, "Ordered groups",
"In a cluster"): the key travels with every copy, and federation moves a
group whole, with all its queued jobs, only while none of them is out, or
not at all; the jobs it left behind as copies hold the group's later jobs
there.  Placement and failover: test_groups_placement.py and
test_groups_failover.py."""

from __future__ import annotations

from typing import Any

from tests.support.cluster import show
from tests.support.process import DisqueProcess, wait_for


def qlen(node: DisqueProcess, queue: str) -> int:
    return int(node.client().execute_command("QLEN", queue))


def test_every_copy_carries_the_group(make_cluster) -> None:
    a, b, c = make_cluster(3)
    job_id = a.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 3,
                                        "GROUP", "order-42")
    for node in (a, b, c):
        info = show(node, job_id)
        assert info is not None and info[b"group"] == b"order-42"


def fetch(node: DisqueProcess, timeout_ms: int = 200) -> list[Any]:
    """One GETJOB on ``node``: on an empty queue it asks the others for jobs
    (NEEDJOBS), so callers poll it until jobs arrive."""
    reply = node.client().execute_command("GETJOB", "TIMEOUT", timeout_ms, "COUNT", 10,
                                          "WITHGROUP", "FROM", "q")
    return reply or []


def test_federation_moves_a_group_whole(make_cluster) -> None:
    a, b = make_cluster(2)
    producer = a.client()
    jobs = [producer.execute_command("ADDJOB", "q", f"a{i}", 5000, "REPLICATE", 1, "RETRY",
                                     60, "GROUP", "A") for i in range(3)]
    # B has nothing: its GETJOB asks A, which hands over the group's next
    # job and every job queued behind it, in one YOURJOBS.  The blocked
    # GETJOB gets one job, as always; the others wait behind it on B.
    first = wait_for(lambda: fetch(b), timeout=15, interval=0.05, message="jobs moved to B")
    assert [entry[1] for entry in first] == jobs[:1]
    assert first[0][-2:] == [b"group", b"A"]
    assert qlen(b, "q") == 2
    # A keeps them as copies (active), nothing of the group queued there.
    assert qlen(a, "q") == 0
    assert all(show(a, job_id)[b"state"] == b"active" for job_id in jobs)
    assert b.client().execute_command("ACKJOB", jobs[0]) == 1
    assert [entry[1] for entry in fetch(b)] == jobs[1:]
    assert b.client().execute_command("ACKJOB", *jobs[1:]) == 2
    wait_for(lambda: all(show(a, job_id) is None for job_id in jobs), timeout=15,
             message="the ACKs' garbage collection to reach A")


def test_federation_leaves_a_group_with_a_job_out_where_it_is(make_cluster) -> None:
    a, b = make_cluster(2)
    producer = a.client()
    jobs = [producer.execute_command("ADDJOB", "q", f"a{i}", 5000, "REPLICATE", 1, "RETRY",
                                     60, "GROUP", "A") for i in range(3)]
    plain = producer.execute_command("ADDJOB", "q", "plain", 5000, "REPLICATE", 1)
    assert [e[1] for e in producer.execute_command("GETJOB", "FROM", "q")] == jobs[:1]
    # a0 is out on A: the group does not move (B gets the plain job only).
    moved = wait_for(lambda: fetch(b), timeout=15, interval=0.05, message="a job moved to B")
    assert [entry[1] for entry in moved] == [plain]
    assert qlen(a, "q") == 2 and fetch(b, 300) == []
    # Once a0 is acknowledged, the rest of the group moves, whole.
    assert producer.execute_command("ACKJOB", jobs[0]) == 1
    rest = wait_for(lambda: fetch(b), timeout=15, interval=0.05, message="the group moved")
    assert [entry[1] for entry in rest] == jobs[1:2]
    assert qlen(a, "q") == 0 and qlen(b, "q") == 1


def test_a_job_added_at_home_waits_for_the_group_moved_away(make_cluster) -> None:
    """The jobs a group left behind as copies hold its later jobs on the
    node it moved from: no job of the group goes out there before the moved
    ones are acknowledged."""
    a, b = make_cluster(2)
    producer = a.client()
    jobs = [producer.execute_command("ADDJOB", "q", f"a{i}", 5000, "REPLICATE", 1, "RETRY",
                                     60, "GROUP", "A") for i in range(2)]
    moved = wait_for(lambda: fetch(b), timeout=15, interval=0.05, message="the group moved")
    assert [entry[1] for entry in moved] == jobs[:1]
    assert qlen(b, "q") == 1
    later = producer.execute_command("ADDJOB", "q", "a2", 5000, "REPLICATE", 1, "RETRY", 60,
                                     "GROUP", "A")
    assert qlen(a, "q") == 1
    assert producer.execute_command("GETJOB", "NOHANG", "FROM", "q") is None
    assert b.client().execute_command("ACKJOB", jobs[0]) == 1
    assert producer.execute_command("GETJOB", "TIMEOUT", 300, "FROM", "q") is None
    assert [entry[1] for entry in fetch(b)] == jobs[1:]
    assert b.client().execute_command("ACKJOB", jobs[1]) == 1
    # The ACKs reach A: a2 goes out (here, or on B by federation).
    got = wait_for(lambda: producer.execute_command("GETJOB", "TIMEOUT", 100, "FROM", "q")
                   or fetch(b, 100), timeout=15, interval=0.05, message="a2 to go out")
    assert [entry[1] for entry in got] == [later]


def test_the_drain_hands_over_whole_groups_and_keeps_held_ones(make_cluster) -> None:
    """SIGTERM: a group none of whose jobs is out goes whole to one peer; a
    group with a job out stays (in the AOF; its copies elsewhere, if any,
    take it over after a RETRY)."""
    import signal

    a, b, c = make_cluster(3, "--appendonly", "yes")
    ra = a.client()
    free = [ra.execute_command("ADDJOB", "q", f"f{i}", 0, "REPLICATE", 1, "RETRY", 300,
                               "GROUP", "free") for i in range(5)]
    held = [ra.execute_command("ADDJOB", "q", f"h{i}", 0, "REPLICATE", 1, "RETRY", 300,
                               "GROUP", "held") for i in range(3)]
    reply = ra.execute_command("GETJOB", "COUNT", 1, "FROM", "q")
    assert [e[1] for e in reply] == [free[0]]  # the older group's first job: out
    assert ra.execute_command("ACKJOB", free[0]) == 1
    reply = ra.execute_command("GETJOB", "COUNT", 1, "FROM", "q")
    taken = reply[0][1]
    assert taken in (free[1], held[0])
    moved, stayed = (held, free[1:]) if taken == free[1] else (free[1:], held)
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(30) == 0
    # The group with nothing out went whole to one peer, in its order.
    on = [n for n in (b, c) if qlen(n, "q")]
    assert len(on) == 1 and qlen(on[0], "q") == len(moved)
    got = on[0].client().execute_command("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
    assert [e[1] for e in got] == moved
    # The held group stayed on a (whose AOF keeps it).
    assert all(show(n, job_id) is None for n in (b, c) for job_id in stayed if job_id != taken)
