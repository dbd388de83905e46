"""Ordered groups in a cluster, one node driven in process with a manual
clock (docs/EXTENSIONS.md, "Ordered groups in a cluster"): the copies of a
group's jobs in the books, their wait by rank, the node that queues the
whole group, the answers to WILLQUEUE and QUEUED; and a job without a
group never reaching any of it.  The same with real nodes:
tests/cluster/test_groups_failover.py."""

from __future__ import annotations

from typing import Any

import pytest

from disque import _native, copies, federation, requeue
from disque.cluster import ClusterNode, messages
from disque.groups import RANK_WAIT_MS
from disque.job import ACTIVE, FLAG_GROUP_COPY, Job, JobIdGenerator, JobState, serialize_job
from disque.job_options import JobExt, bus_trailer
from disque.protocol import NULL_ARRAY
from disque.queue_table import QUEUE_OVERHEAD_BYTES
from disque.rendezvous import outranks

from .statekit import NODE_ID, Node

RETRY_S = 5


def _peers() -> tuple[str, str]:
    """Two peer IDs: one ranking before us for key ``g``, one after."""
    before = after = None
    for i in range(200):
        peer = f"{i:02x}" * 20
        if outranks(b"g", peer, NODE_ID):
            before = before or peer
        else:
            after = after or peer
    assert before is not None and after is not None
    return before, after


BEFORE, AFTER = _peers()


def _cluster() -> tuple[Node, dict[str, ClusterNode]]:
    node = Node()
    peers = {}
    for peer_id in (BEFORE, AFTER):
        peers[peer_id] = node.state.cluster.nodes[peer_id] = ClusterNode(
            peer_id, "127.0.0.1", 7712)  # known, never linked: sends are dropped
    return node, peers


def _peer_job(node: Node, creator: str, group: bytes | None = b"g", ctime_ms: int = 0) -> Job:
    """A job created on ``creator``, with copies on both peers and us."""
    now = node.clock.now_ms()
    job = Job(JobIdGenerator(creator).next_id(600, RETRY_S), b"q", b"body", ACTIVE, 3,
              (ctime_ms or now) * 1_000_000, now + 600_000, 0, RETRY_S,
              frozenset({BEFORE, AFTER, NODE_ID}))
    if group is not None:
        job.ext = JobExt(group=group)
    return job


def _jobs_message(msg_type: int, jobs: list[Job], node: Node, sender: str) -> messages.Message:
    blobs = [serialize_job(job, bus_now_ms=node.clock.now_ms()) for job in jobs]
    msg = messages.decode(messages.jobs_message(msg_type, sender, 7712, 0, blobs, 0,
                                                bus_trailer(jobs)))
    assert msg is not None
    return msg


def _id_message(msg_type: int, job_id: bytes, sender: str) -> messages.Message:
    msg = messages.decode(messages.job_id_message(msg_type, sender, 7712, 0, job_id, 0))
    assert msg is not None
    return msg


def _nothing(node: Node) -> bool:
    """GETJOB NOHANG on ``q`` hands out nothing."""
    return node.raw("GETJOB", "NOHANG", "FROM", "q") in (None, NULL_ARRAY)


def _run(node: Node, ms: int) -> None:
    """Let ``ms`` pass in steps, as the node's timer would (one jump past a
    copy's queue time makes the late WILLQUEUE warn again first)."""
    for _ in range(ms // 100):
        node.advance(100)


def _store(node: Node, peers: dict[str, ClusterNode], jobs: list[Job]) -> list[Job]:
    copies.receive_repljob(node.state, peers[BEFORE],
                           _jobs_message(messages.REPLJOB, jobs, node, BEFORE))
    stored = [node.job(job.id) for job in jobs]
    assert all(job is not None for job in stored)
    return stored  # type: ignore[return-value]


def test_copies_wait_by_rank_and_the_first_due_queues_the_whole_group() -> None:
    node, peers = _cluster()
    now = node.clock.now_ms()
    jobs = [_peer_job(node, BEFORE, ctime_ms=now - 10 + i) for i in range(3)]
    stored = _store(node, peers, jobs)
    for job in stored:
        assert job.flags & FLAG_GROUP_COPY and job.state == JobState.ACTIVE
        # One node (BEFORE) ranks before us: RETRY + 2 s, +-250 ms.
        assert abs(job.qtime - now - RETRY_S * 1000 - RANK_WAIT_MS) <= 250
    q = node.state.queues.lookup(b"q")
    assert q is not None and q.groups is not None and q.groups.by_key[b"g"].copies_count() == 3
    # A job of the group queued here (added by a client here) waits behind them.
    local = node("ADDJOB", "q", "local", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")
    assert node("QLEN", "q") == 1 and _nothing(node)
    # Nobody answers the copies' WILLQUEUE: the first due queues all three.
    _run(node, RETRY_S * 1000 + RANK_WAIT_MS + 600)
    assert node("QLEN", "q") == 4
    got = node("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
    assert [entry[1] for entry in got] == [*(job.id for job in jobs), local.encode()]
    node("ACKJOB", *(entry[1] for entry in got))
    assert q.groups is None  # nothing left: the books are gone


def test_a_copy_acknowledged_elsewhere_lets_the_younger_jobs_here_go() -> None:
    node, peers = _cluster()
    memory = node.state.memory
    before = memory.accounted
    older = _store(node, peers, [_peer_job(node, BEFORE)])[0]
    local = str(node("ADDJOB", "q", "local", 0, "REPLICATE", 1, "RETRY", 60, "GROUP",
                     "g")).encode()
    assert _nothing(node)
    # The node that served it acknowledged it: SETACK reaches the copy here.
    from disque import ack
    ack.receive_setack(node.state, peers[BEFORE], _id_message(messages.SETACK, older.id, BEFORE))
    assert [e[1] for e in node("GETJOB", "NOHANG", "FROM", "q")] == [local]
    node("ACKJOB", local)
    ack.receive_deljob(node.state, peers[BEFORE], _id_message(messages.DELJOB, older.id, BEFORE))
    q = node.state.queues.lookup(b"q")
    assert q is not None and q.groups is None
    # What is left is the queue itself (until it is idle long enough): no books.
    assert not list(node.state.jobs.all())
    assert memory.accounted - before == QUEUE_OVERHEAD_BYTES + len(b"q")


def test_a_node_that_serves_a_group_answers_willqueue_for_its_jobs_out() -> None:
    node, peers = _cluster()
    job_id = str(node("ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")).encode()
    plain = str(node("ADDJOB", "q", "y", 0, "REPLICATE", 1, "RETRY", 60)).encode()
    got = node("GETJOB", "COUNT", 2, "FROM", "q")
    assert {entry[1] for entry in got} == {job_id, plain}
    for job in (node.job(job_id), node.job(plain)):
        job.delivered = frozenset({NODE_ID, BEFORE, AFTER})
    sent = node.state.cluster.messages_dropped
    requeue.receive_willqueue(node.state, peers[AFTER],
                              _id_message(messages.WILLQUEUE, job_id, AFTER))
    assert node.state.cluster.messages_dropped == sent + 2  # QUEUED to both copies
    requeue.receive_willqueue(node.state, peers[AFTER],
                              _id_message(messages.WILLQUEUE, plain, AFTER))
    assert node.state.cluster.messages_dropped == sent + 2  # the original's rule


@pytest.mark.parametrize("sender", [BEFORE, AFTER])
def test_of_two_nodes_serving_a_group_the_lower_ranked_withdraws(sender: str) -> None:
    node, peers = _cluster()
    queued = str(node("ADDJOB", "q", "a", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")).encode()
    later = str(node("ADDJOB", "q", "b", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")).encode()
    for job_id in (queued, later):
        node.job(job_id).delivered = frozenset({NODE_ID, BEFORE, AFTER})
    requeue.receive_queued(node.state, peers[sender],
                           _id_message(messages.QUEUED, queued, sender))
    job = node.job(queued)
    if sender == BEFORE:
        # It ranks before us: our job is a copy again, and holds the later one.
        assert job.state == JobState.ACTIVE and job.flags & FLAG_GROUP_COPY
        assert node("QLEN", "q") == 1 and _nothing(node)
    else:
        assert job.state == JobState.QUEUED
    # The same for a job out here.
    node2, peers2 = _cluster()
    out = str(node2("ADDJOB", "q", "a", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")).encode()
    node2("GETJOB", "FROM", "q")
    node2.job(out).delivered = frozenset({NODE_ID, BEFORE, AFTER})
    requeue.receive_queued(node2.state, peers2[sender], _id_message(messages.QUEUED, out, sender))
    assert bool(node2.job(out).flags & FLAG_GROUP_COPY) == (sender == BEFORE)


def test_federation_moves_the_group_whole_and_keeps_copies() -> None:
    node, _ = _cluster()
    ids = [str(node("ADDJOB", "q", f"a{i}", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")).encode()
           for i in range(3)]
    plain = str(node("ADDJOB", "q", "p", 0, "REPLICATE", 1, "RETRY", 60)).encode()
    q = node.state.queues.lookup(b"q")
    assert q is not None
    sent = federation.send_jobs(node.state, AFTER, q.jobs.first(1))
    assert sent == 3 and node("QLEN", "q") == 1
    assert all(node.job(i).flags & FLAG_GROUP_COPY for i in ids)
    assert node.job(plain).state == JobState.QUEUED


def _raise(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("a job without a group reached the groups' code")


@pytest.mark.skipif(_native.activate() == "compiled",
                    reason="patches the modules' functions: the interpreted core only")
def test_a_job_without_a_group_never_reaches_the_groups_code(monkeypatch) -> None:
    """What a group-free job pays on the paths groups touch: one test of a
    field that is None (``job.ext``, ``q.groups``) or of a flag, never a call."""
    from disque import groups, queue, replication, timers

    for name in groups.__all__:
        if callable(getattr(groups, name)) and not isinstance(getattr(groups, name), type):
            monkeypatch.setattr(groups, name, _raise)
    for module, name in ((copies, "copy_in"), (copies, "rank_wait_ms"),
                         (requeue, "rank_wait_ms"), (requeue, "outranks"),
                         (federation, "queued_jobs"), (replication, "ranking"),
                         (timers, "requeue_group"), (queue, "requeue_group")):
        monkeypatch.setattr(module, name, _raise)
    node, peers = _cluster()
    jobs = [_peer_job(node, BEFORE, group=None) for _ in range(2)]
    _store(node, peers, jobs)
    requeue.receive_willqueue(node.state, peers[AFTER],
                              _id_message(messages.WILLQUEUE, jobs[0].id, AFTER))
    requeue.receive_queued(node.state, peers[AFTER],
                           _id_message(messages.QUEUED, jobs[0].id, AFTER))
    requeue.receive_working(node.state, peers[AFTER],
                            _id_message(messages.WORKING, jobs[1].id, AFTER))
    _run(node, 30_000)  # the copies warn (WILLQUEUE), then queue themselves
    local = str(node("ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 5)).encode()
    got = node("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
    assert len(got) == 3
    node("NACK", local)
    q = node.state.queues.lookup(b"q")
    assert q is not None and q.groups is None
    federation.send_jobs(node.state, AFTER, q.jobs.first(1))
    requeue.receive_queued(node.state, peers[BEFORE],
                           _id_message(messages.QUEUED, jobs[0].id, BEFORE))
    node("ACKJOB", *(entry[1] for entry in got))
    _run(node, 10_000)


def test_a_queued_from_a_node_we_did_not_know_held_the_job_reaches_it() -> None:
    """Both nodes have the job queued, and only the sender knows the other
    holds it (it got the job by federation from a third copy): our QUEUED
    must answer the sender too, or the lower ranked one never withdraws
    (found by the fault harness: a group's jobs queued on two nodes for
    good after a kill schedule, python3 -m faults --groups)."""
    node, peers = _cluster()
    job_id = str(node("ADDJOB", "q", "a", 0, "REPLICATE", 1, "RETRY", 60, "GROUP", "g")).encode()
    job = node.job(job_id)
    job.delivered = frozenset({NODE_ID, BEFORE})
    sent = node.state.cluster.messages_dropped
    requeue.receive_queued(node.state, peers[AFTER], _id_message(messages.QUEUED, job_id, AFTER))
    assert job.state == JobState.QUEUED  # we rank before AFTER: we keep it
    assert job.delivered == {NODE_ID, BEFORE, AFTER}
    assert node.state.cluster.messages_dropped == sent + 2  # QUEUED to BEFORE and AFTER


def test_jobs_handed_over_in_their_last_half_second_stay_copies_until_their_wait() -> None:
    """Federation hands a group over (YOURJOBS) while its jobs' queue time
    is less than 500 ms away (the WILLQUEUE warning of a queued job is no
    longer due): the copies left here must wait a RETRY and their rank, and
    warn first, not queue the group again here at that queue time, while
    the receiver serves it (found by the fault harness without faults:
    python3 -m faults --faults none --nodes 5 --groups 10, a job handed out
    by the pushing node and the receiver at once)."""
    node, _ = _cluster()
    ids = [str(node("ADDJOB", "q", f"a{i}", 0, "REPLICATE", 1, "RETRY", RETRY_S, "GROUP",
                    "g")).encode() for i in range(2)]
    first = node.job(ids[0])
    due = first.qtime
    # 300 ms before the queue time: the queued job's warning time passed.
    _run(node, due - node.clock.now_ms() - 300)
    q = node.state.queues.lookup(b"q")
    assert q is not None and first.state == JobState.QUEUED
    assert federation.send_jobs(node.state, AFTER, q.jobs.first(1)) == 2
    sent = node.state.cluster.messages_dropped
    _run(node, 1000)  # past the queue time the jobs had
    assert node("QLEN", "q") == 0, "the group was queued again here"
    assert all(node.job(i).flags & FLAG_GROUP_COPY for i in ids)
    # They wait a RETRY (AFTER ranks after us: no wait by rank), warning the
    # receiver first, whose QUEUED would keep them copies.
    assert abs(first.qtime - (due - 300 + RETRY_S * 1000)) <= 250 + 100
    _run(node, RETRY_S * 1000 - 1000)
    assert node.state.cluster.messages_dropped > sent  # WILLQUEUE to AFTER
