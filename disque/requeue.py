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

A job of an ordered group (groups.py, "In a cluster") is served by one node
at a time, and its rank is its key's (disque.rendezvous), the same for all
of the group's jobs, so that the whole group goes one way:

* a node that has the job *out* (delivered, dequeued) answers WILLQUEUE
  with QUEUED too: the copies elsewhere do not queue it while the node that
  serves it is up, whatever the job's RETRY says (the original's rule
  lets another copy queue it once RETRY passed since it was last queued);
* of two nodes that both have the job queued, or out, the one that ranks
  lower for the key withdraws (``queue.withdraw_job``): its job becomes a
  copy again, and its group's younger jobs wait behind it;
* a copy waits its RETRY plus ``groups.RANK_WAIT_MS`` per node ranking
  before it (:func:`postpone`, ``copies._store_copy``), and the timer that
  queues it queues the group's other copies with it
  (``queue.requeue_group``): after the failure of the node that served the
  group, the best ranked node holding its copies takes it whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cluster import messages
from .groups import rank_wait_ms
from .job import ACKED, ACTIVE, FLAG_BCAST_WILLQUEUE, FLAG_GROUP_COPY, FLAG_GROUP_OUT, QUEUED, Job
from .job_options import retry_seconds
from .queue import withdraw_job
from .rendezvous import outranks
from .schedule import requeue_time, update_awake_time

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["compare_node_ids_by_job", "postpone", "receive_queued", "receive_willqueue",
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


def _outranked(state: ServerState, sender: ClusterNode, job: Job) -> bool:
    """Whether ``sender`` comes before us for ``job``: by the job (the
    original's de-duplication), or for a job of a group by its key, so that
    all of the group's jobs go the same way."""
    ext = job.ext
    if ext is not None and ext.group is not None:
        return outranks(ext.group, sender.id, state.cluster.myself_id)
    return compare_node_ids_by_job(sender.id, state.cluster.myself_id, job.id) > 0


def postpone(state: ServerState, job: Job, extra_s: int = 0) -> None:
    """Another copy is queued or being worked on: requeue a RETRY (or the
    job's back-off) from now, plus ``extra_s`` (a NACK ... DELAY elsewhere);
    a group's copy, plus its wait by rank (groups.rank_wait_ms)."""
    if job.retry:
        job.qtime = requeue_time(state, retry_seconds(job) + extra_s, state.clock.now_ms())
        if job.flags & FLAG_GROUP_COPY:
            job.qtime += rank_wait_ms(state, job)
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
    if job.state in (ACTIVE, QUEUED):
        # The sender holds the job (it queued it): learn it, as WILLQUEUE
        # does, or our QUEUED below misses the one node it answers.  A node
        # that got the job by federation from another copy is in no list of
        # ours: both of us kept the job queued for good (a group's younger
        # jobs behind it on both), each telling only the others.
        job.delivered = job.delivered | {sender.id}
    keep = False
    if job.state == QUEUED or job.flags & FLAG_GROUP_OUT:
        # Queued here too, or (a group's job) out here too: one of the two
        # nodes steps aside.
        if _outranked(state, sender, job):
            withdraw_job(state, job)
        else:
            state.cluster.broadcast_queued(job, nack=False, count=False)
            # Out here, and we keep it: its lease runs as it did.
            keep = job.state == ACTIVE
    if msg.mflags & messages.MFLAG_INCR_NACKS:
        job.nacks += 1
    elif msg.mflags & messages.MFLAG_INCR_DELIV:
        job.additional_deliveries += 1
    if not keep:
        postpone(state, job)


def receive_working(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """WORKING: a consumer works on the job elsewhere; don't deliver it here.

    Our nodes send WORKING with ``aux`` = seconds for NACK ... DELAY: the
    NACKing node queues the job again then, so this copy waits that much
    longer (the original ignores ``aux``: its copy waits RETRY)."""
    job = _live_copy(state, sender, msg)
    if job is None:
        return
    if job.state == QUEUED:
        withdraw_job(state, job)  # a group's job: a copy here again
    postpone(state, job, msg.aux)


def receive_willqueue(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """WILLQUEUE: the sender is about to requeue the job; if we have it queued,
    or out (a job of a group, which we serve), say so (QUEUED), and learn
    that the sender holds a copy."""
    job = _live_copy(state, sender, msg)
    if job is None:
        return
    if job.state in (ACTIVE, QUEUED):
        job.delivered = job.delivered | {sender.id}
    if job.state == QUEUED or job.flags & FLAG_GROUP_OUT:
        state.cluster.broadcast_queued(job, nack=False, count=False)
