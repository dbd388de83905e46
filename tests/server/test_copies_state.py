"""Copies of jobs from other nodes, driven in process with a manual clock:
the fault harness's scenarios (faults/scenarios.py, docs/FAULTS.md, "What
the scenarios reproduce"), each at the level of the state machine; their
end-to-end runs are tests/faults/test_scenarios.py."""

from __future__ import annotations

from disque import ack, copies, federation
from disque.acked_ids import COLLECTED_ACK_MS
from disque.cluster import ClusterNode, messages
from disque.job import ACTIVE, Job, JobIdGenerator, JobState, serialize_job

from .statekit import NODE_ID, Node

PEER = "b" * 40


def _cluster() -> tuple[Node, ClusterNode]:
    node = Node()
    peer = ClusterNode(PEER, "127.0.0.1", 7712)
    node.state.cluster.nodes[PEER] = peer  # known, never linked: sends are dropped
    return node, peer


def _peer_job(node: Node, ttl_s: int = 600, retry_s: int = 5) -> Job:
    """A job created on the peer, with copies on both nodes."""
    now = node.clock.now_ms()
    job = Job(JobIdGenerator(PEER).next_id(ttl_s, retry_s), b"q", b"body", ACTIVE, 2,
              now * 1_000_000, now + ttl_s * 1000, 0, retry_s, frozenset({PEER, NODE_ID}))
    return job


def _job_message(msg_type: int, job: Job, node: Node) -> messages.Message:
    blob = serialize_job(job, bus_now_ms=node.clock.now_ms())
    msg = messages.decode(messages.jobs_message(msg_type, PEER, 7712, 0, [blob]))
    assert msg is not None
    return msg


def _id_message(msg_type: int, job_id: bytes, aux: int = 0) -> messages.Message:
    msg = messages.decode(messages.job_id_message(msg_type, PEER, 7712, 0, job_id, aux))
    assert msg is not None
    return msg


def _dropped(node: Node) -> int:
    return node.state.cluster.messages_dropped


def test_a_replicated_copy_keeps_the_jobs_ttl() -> None:
    node, peer = _cluster()
    job = _peer_job(node, ttl_s=600)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    copy = node.job(job.id)
    assert copy is not None
    # The time left on the wire (+1 s), not 1000 times it.
    assert 600_000 <= copy.etime - node.clock.now_ms() <= 601_000


def test_a_copy_acked_by_setack_runs_the_gc_itself() -> None:
    """The node that completes the GC sends DELJOB; if that is lost the
    acked copy must not wait for its TTL."""
    node, peer = _cluster()
    job = _peer_job(node)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    ack.receive_setack(node.state, peer, _id_message(messages.SETACK, job.id, aux=2))
    copy = node.job(job.id)
    assert copy is not None and copy.state == JobState.ACKED
    before = _dropped(node)
    node.advance(2_500)  # the first GC attempt of its own, ~1-2 s later
    assert _dropped(node) == before + 1  # SETACK to the peer (no link here)
    ack.receive_gotack(node.state, peer, _id_message(messages.GOTACK, job.id, aux=0))
    assert node.job(job.id) is None  # every copy confirmed: forgotten


def test_a_job_whose_ack_reached_us_is_not_taken_in_later() -> None:
    """We told a GC we do not hold the job (GOTACK 0), or deleted our copy on
    its DELJOB, so it may be gone everywhere; a YOURJOBS or REPLJOB of that
    job landing afterwards (held back on a slow link) must not queue it
    again."""
    node, peer = _cluster()
    late, other = _peer_job(node), _peer_job(node)
    ack.receive_setack(node.state, peer, _id_message(messages.SETACK, late.id, aux=2))
    assert node.job(late.id) is None  # nothing to ack here: answered GOTACK(0)
    federation.receive_yourjobs(node.state, peer, _job_message(messages.YOURJOBS, late, node))
    assert node.job(late.id) is None and node("QLEN", "q") == 0
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, late, node))
    assert node.job(late.id) is None
    # A copy we held, acked and deleted when the GC completed (DELJOB):
    # the same for its YOURJOBS (the fault harness's lossy-link case).
    held = _peer_job(node)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, held, node))
    ack.receive_setack(node.state, peer, _id_message(messages.SETACK, held.id, aux=2))
    ack.receive_deljob(node.state, peer, _id_message(messages.DELJOB, held.id))
    assert node.job(held.id) is None
    federation.receive_yourjobs(node.state, peer, _job_message(messages.YOURJOBS, held, node))
    assert node.job(held.id) is None and node("QLEN", "q") == 0
    # Another job is imported as usual.
    federation.receive_yourjobs(node.state, peer, _job_message(messages.YOURJOBS, other, node))
    assert node("QLEN", "q") == 1
    # The memory of the ACK fades after a while.
    node.advance(COLLECTED_ACK_MS + 1)
    assert not ack.acked_elsewhere(node.state, late.id, node.clock.now_ms())


def test_a_late_requeue_warns_twice_and_waits_before_queueing() -> None:
    """A node resumed after a stop longer than RETRY finds its copy's queue
    time past: it warns (WILLQUEUE), warns again on the links made again,
    and queues only if nobody answered QUEUED meanwhile."""
    node, peer = _cluster()
    job = _peer_job(node, retry_s=5)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    before = _dropped(node)
    node.advance(20_000)  # stopped well past RETRY
    copy = node.job(job.id)
    assert copy.state == JobState.ACTIVE and _dropped(node) == before + 1  # WILLQUEUE
    node.advance(500)
    assert copy.state == JobState.ACTIVE and _dropped(node) == before + 2  # WILLQUEUE again
    node.advance(500)
    assert copy.state == JobState.QUEUED  # nobody objected


def test_a_late_requeue_yields_to_a_copy_queued_elsewhere() -> None:
    node, peer = _cluster()
    job = _peer_job(node, retry_s=5)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    node.advance(20_000)
    copy = node.job(job.id)
    assert copy.state == JobState.ACTIVE
    # The peer has it queued and says so (its answer to our WILLQUEUE).
    from disque import requeue
    requeue.receive_queued(node.state, peer, _id_message(messages.QUEUED, job.id))
    node.advance(1_000)
    assert copy.state == JobState.ACTIVE and node("QLEN", "q") == 0


def test_the_gc_retries_soon_when_the_node_it_waits_for_is_back() -> None:
    """An acked job whose GC waits for an unreachable copy backs off (1, 2,
    4 ... up to 180 s); when that node answers again the next attempt comes
    within a second, with the backoff reset, not at the end of the backoff."""
    node, peer = _cluster()
    job = _peer_job(node)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    ack.receive_setack(node.state, peer, _id_message(messages.SETACK, job.id, aux=2))
    copy = node.job(job.id)
    assert copy is not None
    for _ in range(8):  # the peer stays silent: eight attempts, each later
        node.advance(copy.qtime - node.clock.now_ms())
    waited = copy.qtime - node.clock.now_ms()
    assert waited > 60_000 and copy.gc_retry >= 8
    before = _dropped(node)
    ack.node_reachable_again(node.state, "c" * 40)   # another node: nothing changes
    assert copy.qtime - node.clock.now_ms() == waited
    ack.node_reachable_again(node.state, PEER)
    assert copy.qtime - node.clock.now_ms() <= ack.GC_RESUME_SPREAD_MS
    assert copy.gc_retry == 0
    node.advance(ack.GC_RESUME_SPREAD_MS)
    assert _dropped(node) == before + 1  # the SETACK went out (no link here)


def test_a_queued_copy_that_outranks_the_sender_of_queued_answers_it() -> None:
    """Two nodes hold a job queued (a QUEUED lost while a link was down).
    The lower-ranked one sends QUEUED at its RETRY; the higher-ranked one
    must answer with its own, so that the other steps aside.  Only
    postponing its requeue (as the original does) kept it from ever sending
    one: each QUEUED from the other pushed its next one past the other's."""
    from disque import requeue

    node, peer = _cluster()
    job = _peer_job(node)
    while requeue.compare_node_ids_by_job(PEER, NODE_ID, job.id) > 0:
        job = _peer_job(node)  # one for which this node outranks the peer
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    node("ENQUEUE", job.id)
    copy = node.job(job.id)
    assert copy.state == JobState.QUEUED
    before = _dropped(node)
    requeue.receive_queued(node.state, peer, _id_message(messages.QUEUED, job.id))
    assert copy.state == JobState.QUEUED and node("QLEN", "q") == 1
    assert _dropped(node) == before + 1  # our QUEUED, to the peer
    # The peer answers alike from its side and outranks nobody: we keep it.
    for _ in range(3):
        requeue.receive_queued(node.state, peer, _id_message(messages.QUEUED, job.id))
    assert copy.state == JobState.QUEUED


def test_a_queued_copy_steps_aside_for_a_higher_ranked_sender_of_queued() -> None:
    from disque import requeue

    node, peer = _cluster()
    job = _peer_job(node)
    while requeue.compare_node_ids_by_job(PEER, NODE_ID, job.id) < 0:
        job = _peer_job(node)
    copies.receive_repljob(node.state, peer, _job_message(messages.REPLJOB, job, node))
    node("ENQUEUE", job.id)
    before = _dropped(node)
    requeue.receive_queued(node.state, peer, _id_message(messages.QUEUED, job.id))
    assert node.job(job.id).state == JobState.ACTIVE and node("QLEN", "q") == 0
    assert _dropped(node) == before  # nothing to answer
