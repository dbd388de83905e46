"""Re-queueing without duplicates across the copies of a job (the spec's
"Queued / WILLQUEUE" messages).

Every node holding a copy requeues it at its RETRY time.  To keep a job
queued on at most one node at a time:

* a node that queues a job again tells the other copies with QUEUED; they
  postpone their own requeue by RETRY (and the one that loses the tie, by
  the job-dependent node order below, drops it from its queue);
* 500 ms before requeueing, a node sends WILLQUEUE; a node that has the job
  queued answers QUEUED, so the warned node does not queue it too;
* WORKING (a consumer asked for more time) postpones every copy;
* a node that hears about a job it has acked answers SETACK, so the GC
  reaches a copy that missed the ACK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cluster import messages
from .job import ACKED, ACTIVE, FLAG_BCAST_WILLQUEUE, QUEUED, Job
from .job_options import retry_seconds
from .queue import dequeue_job
from .schedule import requeue_time, update_awake_time

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["compare_node_ids_by_job", "receive_queued", "receive_willqueue",
           "receive_working"]


def compare_node_ids_by_job(a: str, b: str, job_id: bytes) -> int:
    """The order of two nodes for one job (compareNodeIDsByJob): each ID XORed
    with the job ID's random part, then compared.  Every node computes the
    same order, and it differs from job to job, so no node always loses."""
    for i in range(40):
        mask = job_id[11 + i % 24]
        x, y = ord(a[i]) ^ mask, ord(b[i]) ^ mask
        if x != y:
            return 1 if x > y else -1
    return 0


def _postpone(state: ServerState, job: Job, extra_s: int = 0) -> None:
    """Another copy is queued or being worked on: requeue a RETRY (or the
    job's back-off) from now, plus ``extra_s`` (a NACK ... DELAY elsewhere)."""
    if job.retry:
        job.qtime = requeue_time(state, retry_seconds(job) + extra_s, state.clock.now_ms())
        job.flags |= FLAG_BCAST_WILLQUEUE
        update_awake_time(state, job)


def _live_copy(state: ServerState, sender: ClusterNode, msg: Message) -> Job | None:
    """The job a message is about, unless unknown or acked here.  An acked
    one is answered with SETACK: the sender missed the ACK, and the GC must
    reach its copy."""
    job = state.jobs.get(msg.job_id)
    if job is not None and job.state == ACKED:
        state.cluster.send_setack(sender.id, job, len(job.delivered))
        return None
    return job


def receive_queued(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """QUEUED: the sender queued the job; step aside if it outranks us, else
    say that we hold it queued too, so that the sender steps aside.

    Without the answer (the original only postpones its requeue) two copies
    queued at once stay so: each QUEUED from the lower-ranked one pushes the
    higher-ranked one's next QUEUED, sent at its RETRY, past the other's."""
    job = _live_copy(state, sender, msg)
    if job is None:
        return
    if job.state == QUEUED:
        if compare_node_ids_by_job(sender.id, state.cluster.myself_id, job.id) > 0:
            dequeue_job(state, job)
        else:
            state.cluster.broadcast_queued(job, nack=False, count=False)
    if msg.mflags & messages.MFLAG_INCR_NACKS:
        job.nacks += 1
    elif msg.mflags & messages.MFLAG_INCR_DELIV:
        job.additional_deliveries += 1
    _postpone(state, job)


def receive_working(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """WORKING: a consumer works on the job elsewhere; don't deliver it here.

    Our nodes send WORKING with ``aux`` = seconds for NACK ... DELAY: the
    NACKing node queues the job again then, so this copy waits that much
    longer (the original ignores ``aux``: its copy waits RETRY)."""
    job = _live_copy(state, sender, msg)
    if job is None:
        return
    dequeue_job(state, job)
    _postpone(state, job, msg.aux)


def receive_willqueue(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """WILLQUEUE: the sender is about to requeue the job; if we have it queued,
    say so (QUEUED), and learn that the sender holds a copy."""
    job = _live_copy(state, sender, msg)
    if job is None:
        return
    if job.state in (ACTIVE, QUEUED):
        job.delivered = job.delivered | {sender.id}
    if job.state == QUEUED:
        state.cluster.broadcast_queued(job, nack=False, count=False)
