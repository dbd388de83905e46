"""Acknowledgements and the garbage collection of acked jobs (ack.c).

An ACK is a proof of delivery that must reach every node that may hold a
copy before the job can be forgotten, or a partitioned copy would requeue a
job already processed.  The spec's procedures are :func:`acknowledge_job`
(ACK-JOB) and :func:`try_job_gc` (START-GC), retried with an exponential
backoff from the schedule.  On a single node the job is forgotten at the
first attempt: every copy (this one) knows about the ACK.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .clock import random_time_error
from .job import ACKED, QUEUED, Job, ttl_minutes_from_id
from .jobs import register_job, unregister_job
from .queue import dequeue_job, release_group
from .schedule import update_awake_time
from .waitjob import job_completed

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["acknowledge_job", "acked_elsewhere", "try_job_gc", "create_dummy_ack", "fast_ack",
           "remember_collected", "gc_retry_delay_ms", "node_reachable_again", "receive_deljob",
           "receive_gotack", "receive_setack"]

log: Final = logging.getLogger("disque.ack")

#: gc_retry stops growing here (the original's cap).
GC_RETRY_CAP: Final = 10
#: Longest pause between two GC attempts.
GC_MAX_DELAY_MS: Final = 180_000
#: When a node the GC waits for is reachable again, the waiting jobs retry
#: within this many ms (spread, not all in one turn).
GC_RESUME_SPREAD_MS: Final = 1000


_NOBODY: Final[frozenset[str]] = frozenset()


def acknowledge_job(state: ServerState, job: Job, gc_follows: bool = False) -> bool:
    """ACK-JOB(job): mark it acked and dequeue it; False if it already was.

    ``gc_follows``: the caller runs :func:`try_job_gc` right away, which
    reschedules the job and makes it evictable (or forgets it), so neither
    is done here.
    """
    if job.state == ACKED:
        return False
    if job.state == QUEUED:
        dequeue_job(state, job)
    job.state = ACKED
    job.confirmed = _NOBODY
    job.qtime = 0
    ext = job.ext
    if ext is not None and ext.group is not None:
        release_group(state, job)  # the group's next job may go out now
    if not gc_follows:
        state.jobs.evictable_add(job)
    # An ADDJOB still waiting for this job's copies gets its ID (the job was
    # processed), WAITJOB clients +ACKED, the AOF an ACK record.
    state.events.job_acked(state, job)
    if not gc_follows:
        # Every acked copy runs the GC too, with the backoff (the original's
        # updateJobAwakeTime): if the DELJOB of the node that completes it
        # is lost, this copy still goes, rather than live out its TTL.
        job.qtime = state.clock.now_ms() + gc_retry_delay_ms(job.gc_retry)
        update_awake_time(state, job)
    return True


def gc_retry_delay_ms(gc_retry: int) -> int:
    """Backoff between GC attempts: 1 s, 2 s, 4 s ... capped at 180 s."""
    return min(1000 * (1 << gc_retry), GC_MAX_DELAY_MS) + random_time_error()


def _can_log_ack(state: ServerState) -> bool:
    """Whether this node's AOF (if it has one) can log an ACK now.

    A node confirms an ACK (GOTACK) or completes a GC (DELJOB to the copies)
    only then: a copy that took an ACK in memory while its disk refused the
    record, and deleted the job everywhere, would load the job un-acked
    from its AOF after a crash and deliver it again, with no other copy left
    to tell it of the ACK.  The GC asks again later; the other copies keep
    the ACK meanwhile.
    """
    persistence = state.logging_persistence
    return persistence is None or persistence.can_log()


def try_job_gc(state: ServerState, job: Job) -> None:
    """START-GC(job): forget the job if every copy knows it is acked, else ask them.

    Nodes are compared by identity, not by count (the original compared the
    sizes of the two lists and could finish early).
    """
    if job.state != ACKED:
        return
    if job.gc_retry < GC_RETRY_CAP:
        job.gc_retry += 1
    cluster = state.cluster
    confirmed = job.confirmed
    if cluster.myself_id not in confirmed:
        # The usual case (nobody confirmed yet) shares the one {myself} set.
        confirmed = job.confirmed = (confirmed | cluster.myself_set if confirmed
                                     else cluster.myself_set)
    delivered = job.delivered
    if delivered:
        if cluster.forgotten:
            forgotten = (delivered - confirmed) & cluster.forgotten
            if forgotten:
                # CLUSTER FORGET removed them: they will never answer, and
                # waiting for them would keep the ACK until the TTL (as the
                # original did).
                confirmed = job.confirmed = confirmed | forgotten
        if delivered <= confirmed:
            if _can_log_ack(state):
                unregister_job(state, job)
                return
            # Every copy knows, but our own ACK may not be in the AOF: try
            # again later (see _can_log_ack).
        else:
            for node_id in delivered - confirmed:
                cluster.send_setack(node_id, job, len(delivered))
    else:
        # A dummy ACK: nobody here knows who has the job, so ask everybody.
        if cluster.size <= 1:
            unregister_job(state, job)
            return
        for node_id in cluster.other_node_ids():
            cluster.send_setack(node_id, job, 0)
    state.jobs.evictable_add(job)  # if acknowledge_job left it to us (no-op otherwise)
    job.qtime = state.clock.now_ms() + gc_retry_delay_ms(job.gc_retry)
    update_awake_time(state, job)


def node_reachable_again(state: ServerState, node_id: str) -> None:
    """A node flagged failing answers again: every acked job whose GC waits
    for it (a copy there not confirmed yet; any node, for a dummy ACK) makes
    its next attempt within :data:`GC_RESUME_SPREAD_MS`, with the backoff
    reset, instead of at the end of a backoff that grew while the node was
    away (up to 180 s, so acked copies lingered minutes after a partition
    healed).  Acked jobs are all among the evictable ones."""
    now = state.clock.now_ms()
    moved = 0
    for job in state.jobs.evictable_jobs():
        if job.state != ACKED or node_id in job.confirmed:
            continue
        if job.delivered and node_id not in job.delivered:
            continue
        due = now + GC_RESUME_SPREAD_MS // 2 + random_time_error(GC_RESUME_SPREAD_MS)
        if job.qtime > due:
            job.gc_retry = 0
            job.qtime = due
            update_awake_time(state, job)
            moved += 1
    if moved:
        log.info("Node %s is reachable again: %d acked jobs retry their GC now", node_id,
                 moved)


def create_dummy_ack(state: ServerState, job_id: bytes) -> Job | None:
    """Hold an ACK for a job this node never saw, so a partitioned copy learns of it.

    Only for at-least-once IDs (odd TTL field), only in a cluster and never
    while leaving: a single node knows the job does not exist anywhere.
    """
    cluster = state.cluster
    if cluster.size <= 1 or cluster.leaving:
        return None
    ttl_minutes = ttl_minutes_from_id(job_id)
    if not ttl_minutes & 1:
        return None
    now = state.clock.now_ms()
    job = Job(bytes(job_id), None, b"", state=ACKED,
              ctime=now * 1_000_000, etime=now + ttl_minutes * 60_000)
    register_job(state, job)
    return job


def fast_ack(state: ServerState, job_id: bytes) -> bool:
    """FASTACK one ID: best-effort DELJOB to the copies, delete locally."""
    job = state.jobs.get(job_id)
    cluster = state.cluster
    if job is None:
        cluster.broadcast_deljob(job_id, None)
        return False
    cluster.broadcast_deljob(job_id, job.delivered)
    if job.state != ACKED:
        job_completed(state, job.id)  # WAITJOB
    unregister_job(state, job)
    return True


# --------------------------------------------------------------------------
# Bus messages of the GC (SETACK, GOTACK, DELJOB)
# --------------------------------------------------------------------------

def remember_collected(state: ServerState, job_id: bytes) -> None:
    """The job's ACK reached us (SETACK of a job we do not hold, or DELJOB):
    its GC may count us as confirmed and delete it everywhere, so a copy
    still on its way to us, a YOURJOBS or REPLJOB held back on a slow link
    (TCP orders one link, not two), must not be taken in when it lands, or
    a job whose ACK completed would be queued again."""
    state.collected_acks.remember(job_id, state.clock.now_ms())


def acked_elsewhere(state: ServerState, job_id: bytes, now: int) -> bool:
    """True for a job whose ACK reached us lately (see :func:`remember_collected`)."""
    return state.collected_acks.acked(job_id, now)


def receive_setack(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """SETACK(may_have): the sender acked the job and asks if we know it.

    We ack our copy and answer GOTACK(known).  When we know of more copies
    than the sender (``aux`` is the size of its node list), the sender's
    view is incomplete: our own GC takes over, and a sender holding a dummy
    ACK (``aux`` 0) is told we know the job so that it drops its dummy.
    """
    if not _can_log_ack(state):
        return   # no GOTACK for an ACK the AOF cannot log: the GC asks again
    job = state.jobs.get(msg.job_id)
    cluster = state.cluster
    if job is not None:
        acknowledge_job(state, job)
    else:
        remember_collected(state, msg.job_id)
    if job is None or len(job.delivered) <= msg.aux:
        cluster.send_gotack(sender.id, msg.job_id, job is not None)
        return
    if msg.aux == 0:
        cluster.send_gotack(sender.id, msg.job_id, True)
    try_job_gc(state, job)


def receive_gotack(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """GOTACK(known): a node confirms the ACK (gotAckReceived)."""
    job = state.jobs.get(msg.job_id)
    if job is None or job.state != ACKED:
        return
    known = bool(msg.aux)
    if job.is_dummy_ack:
        if known:
            # That node knows the job and runs the GC with the real node list.
            unregister_job(state, job)
            return
        job.confirmed = job.confirmed | {sender.id}
        nodes = state.cluster.nodes
        if all(node_id in job.confirmed for node_id, node in nodes.items()
               if "handshake" not in node.flags):
            unregister_job(state, job)
        return
    if known or sender.id in job.delivered:
        job.delivered = job.delivered | {sender.id}
        job.confirmed = job.confirmed | {sender.id}
    if job.delivered <= job.confirmed and _can_log_ack(state):
        # (When our ACK cannot be logged yet, the GC's next attempt, already
        # scheduled, completes it.)
        state.cluster.broadcast_deljob(job.id, job.delivered)
        unregister_job(state, job)


def receive_deljob(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """DELJOB: the GC completed (or FASTACK): forget the job in any state."""
    job = state.jobs.get(msg.job_id)
    if job is not None:
        if job.state != ACKED and state.job_waiters:
            # The GC of an ACK elsewhere completed, or a FASTACK: WAITJOB
            # clients learn of the ACK (acked_elsewhere answers later ones).
            job_completed(state, job.id)
        unregister_job(state, job)
    remember_collected(state, msg.job_id)
