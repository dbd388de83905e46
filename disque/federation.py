"""Federation: consumers on one node get the jobs queued on others
(the spec's NEEDJOBS / YOURJOBS).

A node whose consumers wait on an empty queue asks for jobs:

* **broadcast**: NEEDJOBS(1) to every linked node, at most every
  min(2 s x 2^attempt, 30 s) while nobody answers;
* **ad hoc**: NEEDJOBS(count) to the *responders* (nodes that sent jobs for
  this queue in the last 5 s), every min(25 ms x 2^attempt, 2 s), or at once
  when a consumer emptied a queue that imports jobs.  ``count`` follows the
  queue's import rate, split between the responders, within [5, 100].

A node with jobs answers YOURJOBS with up to ``count`` of its queued jobs,
those it would hand out first (the highest priorities, then the oldest;
half of them if it has fewer than twice that).  They leave its queue
(and are forgotten here if at-most-once); the importing node queues them
and joins their node list, so the ACK's garbage collection reaches it.

Never: a leaving node asks for jobs; a node exports jobs while it imports
the same queue itself; an acked job is queued again by an import.

An ordered group (groups.py) moves whole or not at all: a group's next job
leaves with every job queued behind it, in their order, and only while
none of the group's jobs is out here (nor a copy of an older one: then the
group has no next job to hand out).  The jobs stay here as the group's
copies, so the group's jobs added here later wait until the moved ones are
acknowledged (the ACK's garbage collection reaches this node).  A group
never spans two YOURJOBS (one that does not fit after other jobs waits for
the next), and no group goes when an original node asks (it knows nothing
of groups: it would hand the jobs out to any consumer, in any order).

Per-queue state lives in ``queue_table.QueueFederation``, made on first
use, so queues that never federate cost nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .ack import acked_elsewhere
from .cluster import messages
from .copies import adopt_copy, jobs_in, merge_copy
from .groups import queued_jobs
from .job import ACKED, FLAG_BCAST_QUEUED, Job, serialize_job
from .job_options import bus_trailer
from .jobs import register_job, unregister_job
from .queue import enqueue_job, withdraw_job
from .queue_table import PAUSED_OUT, Queue, QueueFederation
from .waiters import BlockedGet

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["import_from", "import_rate", "need_jobs", "need_jobs_cron", "receive_needjobs",
           "receive_yourjobs", "send_jobs"]

#: A node that sent jobs within this long is a responder.
RESPONDER_WINDOW_MS: Final = 5000
#: NEEDJOBS count bounds (the original's), and the most jobs one YOURJOBS carries.
MIN_COUNT, MAX_COUNT = 5, 100
BCAST_BASE_MS, BCAST_MAX_MS = 2000, 30_000
ADHOC_BASE_MS, ADHOC_MAX_MS = 25, 2000
#: One YOURJOBS carries at most this many bytes of jobs (at least one job):
#: a receiver refuses a message over its proto-max-bulk-len + 1 MB.
MAX_YOURJOBS_BYTES: Final = 16 * 1024 * 1024
#: Back-off attempts stop growing here (the original's counters overflowed).
MAX_ATTEMPT: Final = 16
#: The import rate is 0 once its newest second is this old.
RATE_STALE_MS: Final = 5000


def _fed(q: Queue) -> QueueFederation:
    if q.fed is None:
        q.fed = QueueFederation()
    return q.fed


def import_rate(q: Queue, now: int) -> int:
    """Jobs per second imported lately (getQueueImportRate)."""
    fed = q.fed
    if fed is None or not fed.cur_start or now - fed.cur_start > RATE_STALE_MS:
        return 0
    start = fed.prev_start or fed.cur_start
    elapsed = max(50, now - start)
    return -(-(fed.prev_count + fed.cur_count) * 1000 // elapsed)


def import_from(q: Queue, now: int) -> list[bytes]:
    """The responders of the last 5 s (QSTAT's ``import-from``)."""
    if q.fed is None:
        return []
    return [node_id.encode() for node_id, when in q.fed.responders.items()
            if now - when <= RESPONDER_WINDOW_MS]


def _count_import(fed: QueueFederation, now: int, jobs: int) -> None:
    if now - fed.cur_start >= 1000:
        fed.prev_start, fed.prev_count = fed.cur_start, fed.cur_count
        fed.cur_start, fed.cur_count = now, 0
    fed.cur_count += jobs


# --------------------------------------------------------------------------
# Asking (NEEDJOBS)
# --------------------------------------------------------------------------

def need_jobs(state: ServerState, q: Queue, reached_zero: bool = False) -> None:
    """needJobsForQueue: ask other nodes for jobs of ``q``, with back-off.

    Not while ``q``'s rate limit holds its consumers back (its window is
    full): they wait for the window, not for jobs, and jobs brought here
    would only wait too.  Nor more than the window still lets through.
    """
    cluster = state.cluster
    if cluster.leaving or len(cluster.nodes) == 1:
        return
    now = state.clock.now_ms()
    limit = q.limit
    room = limit.left(now) if limit is not None else MAX_COUNT
    if not room:
        return
    fed = _fed(q)
    for node_id in [n for n, when in fed.responders.items()
                    if now - when > RESPONDER_WINDOW_MS or n not in cluster.nodes]:
        del fed.responders[node_id]
    if now - fed.bcast_time > min(BCAST_BASE_MS << fed.bcast_attempt, BCAST_MAX_MS):
        cluster.broadcast(cluster.queue_message(messages.NEEDJOBS, q.name, 1))
        fed.bcast_time = now
        fed.bcast_attempt = min(fed.bcast_attempt + 1, MAX_ATTEMPT)
    if fed.responders and (reached_zero or now - fed.adhoc_time > min(
            ADHOC_BASE_MS << fed.adhoc_attempt, ADHOC_MAX_MS)):
        count = min(MAX_COUNT, room,
                    max(MIN_COUNT, import_rate(q, now) // len(fed.responders)))
        message = cluster.queue_message(messages.NEEDJOBS, q.name, count)
        for node_id in fed.responders:
            cluster.send(node_id, message)
        fed.adhoc_time = now
        fed.adhoc_attempt = min(fed.adhoc_attempt + 1, MAX_ATTEMPT)


def need_jobs_cron(state: ServerState) -> None:
    """Every cron run: queues with blocked consumers keep asking (the
    original's clientsCron visit to blocked clients)."""
    if len(state.cluster.nodes) == 1 or not state.blocked_clients:
        return
    asked: set[bytes] = set()
    for client in list(state.clients.values()):
        blocked = client.blocked
        if not isinstance(blocked, BlockedGet):
            continue  # not waiting for jobs (a replicating ADDJOB, a WAITJOB)
        for q in blocked.queues:
            if q.name not in asked and not q.jobs:
                asked.add(q.name)
                need_jobs(state, q)


# --------------------------------------------------------------------------
# Answering (NEEDJOBS received, YOURJOBS sent)
# --------------------------------------------------------------------------

def receive_needjobs(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """receiveNeedJobs: send the asker the queued jobs we would hand out first."""
    q = state.queues.lookup(msg.queue)
    now = state.clock.now_ms()
    if q is None or not q.jobs or q.flags & PAUSED_OUT or import_rate(q, now):
        return
    wanted = min(max(1, msg.aux), MAX_COUNT)  # bounded: the original overflowed a buffer
    count = wanted if len(q.jobs) >= 2 * wanted else max(1, len(q.jobs) // 2)
    groups = q.groups
    if groups is not None and not sender.caps & messages.CAP_BATCH:
        # An original node asks: no group goes there (see the module's doc).
        # The order holds one job per group at most: look that much further.
        jobs = [job for job in q.jobs.first(count + len(groups.by_key))
                if job.ext is None or job.ext.group is None][:count]
        if not jobs:
            return
    else:
        jobs = q.jobs.first(count)
    send_jobs(state, sender.id, jobs)


def send_jobs(state: ServerState, node_id: str, jobs: list[Job]) -> int:
    """YOURJOBS: hand ``jobs``, queued here, to ``node_id``; how many went.

    They leave our queue (and are forgotten here if at-most-once); a job of
    an ordered group that is its group's next job takes the group's other
    queued jobs with it (:func:`_whole`).  One message carries at most
    MAX_YOURJOBS_BYTES (at least one job, or one group), the rest stay
    queued.  NEEDJOBS answers with this; so does the drain on SIGTERM
    (drain.py), unasked.
    """
    now = state.clock.now_ms()
    blobs: list[bytes] = []
    sent: list[Job] = []
    size = 0
    for first in jobs:
        unit = _whole(state, first)
        befores = []
        unit_blobs = []
        for job in unit:
            # The receiver holds a copy from now on: the GC must reach it (the
            # original left it out of the node list and could finish the GC early).
            befores.append(job.delivered)
            job.delivered = job.delivered | {node_id}
            unit_blobs.append(serialize_job(job, bus_now_ms=now))
        unit_size = sum(len(blob) for blob in unit_blobs)
        if blobs and size + unit_size > MAX_YOURJOBS_BYTES:
            for job, before in zip(unit, befores, strict=True):
                job.delivered = before  # not sent: stays queued here as it was
            break
        blobs += unit_blobs
        sent += unit
        size += unit_size
        for job in unit:
            withdraw_job(state, job)  # a group's job stays here as a copy
            if job.retry == 0:
                unregister_job(state, job)  # at most once: only the receiver has it now
    state.cluster.send(node_id, state.cluster.jobs_message(
        messages.YOURJOBS, blobs, trailer=bus_trailer(sent)))
    return len(blobs)


def _whole(state: ServerState, job: Job) -> list[Job]:
    """What leaves with ``job``: itself, or for the next job of an ordered
    group, the group's queued jobs in their order (groups.queued_jobs)."""
    ext = job.ext
    if ext is None or ext.group is None or job.queue is None:
        return [job]
    q = state.queues.lookup(job.queue)
    return queued_jobs(q, job) if q is not None else [job]


def receive_yourjobs(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """receiveYourJobs: queue the jobs another node sent for our consumers."""
    now = state.clock.now_ms()
    myself = state.cluster.myself_set
    imported: dict[bytes, int] = {}
    for copy in jobs_in(msg, sender):
        if copy.state == ACKED:
            continue  # never import an acked job
        job = state.jobs.get(copy.id)
        if job is None and acked_elsewhere(state, copy.id, now):
            continue  # its ACK's GC completed while it travelled
        if job is None:
            job = copy
            adopt_copy(state, job, now)
            job.delivered = job.delivered | myself
            job.qtime = 0
            register_job(state, job)
        else:
            job.delivered = job.delivered | copy.delivered | myself
            if copy.ext is not None:
                merge_copy(state, job, copy)
        if job.state == ACKED:
            continue  # acked here: never queued again (the original's import did)
        job.flags &= ~FLAG_BCAST_QUEUED
        job.qtime = job.qtime or now  # RETRY-0 jobs need a queue time to be queued
        if enqueue_job(state, job, now=now) and job.queue is not None:
            imported[job.queue] = imported.get(job.queue, 0) + 1
            # The sender's copy would be due again at the time it had, less
            # the time the job waited there than ours: tell it (and the other
            # copies) that the job is queued here, so their RETRY restarts
            # with ours (a QUEUED that counts nothing; the original sends none).
            state.cluster.broadcast_queued(job, nack=False, count=False)
    for name, count in imported.items():
        q = state.queues.lookup(name)
        if q is None:
            continue
        fed = _fed(q)
        if sender.id not in fed.responders:
            fed.bcast_attempt = 0
        fed.responders[sender.id] = now
        fed.adhoc_attempt = 0
        _count_import(fed, now, count)
