"""The receiving side of replication: copies of other nodes' jobs.

* REPLJOB: store the copies (active, first requeue after DELAY + RETRY) and
  confirm them with GOTJOB, unless this node is above 75% memory, leaving,
  its AOF cannot be written, or the queue is paused for input (the sender
  then picks another node);
  a copy of a job whose ACK reached us lately is not taken in.
* ENQUEUE: the creator asks this copy to queue the job (external
  replication, RETRY-0 jobs).
* A copy of a job we hold merges into ours: its node list, and a
  dead-letter move made elsewhere (:func:`merge_copy`).
* A copy of a job of an ordered group is one of its group's copies here
  (groups.py): it holds the group's younger jobs on this node, waits its
  RETRY plus its wait by rank, and when its time comes this node queues
  the group's copies together (groups.py, "In a cluster").

:func:`jobs_in` and :func:`adopt_copy` serve federation's YOURJOBS too.
The creator's side is ``replication.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .ack import acked_elsewhere
from .clock import random_time_error
from .cluster import messages
from .groups import copy_in, rank_wait_ms
from .job import (
    ACKED,
    ACTIVE,
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    QUEUED,
    Job,
    SerializationError,
    deserialize_job,
)
from .job_options import ExtError, apply_bus_trailer
from .jobs import register_job
from .log import RateLimitedLog
from .queue import dequeue_job, enqueue_job, release_group
from .queue_table import PAUSED_IN
from .schedule import update_awake_time

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["adopt_copy", "jobs_in", "merge_copy", "receive_enqueue", "receive_repljob"]

log: Final = logging.getLogger("disque.copies")
#: A peer (or, without the cluster secret, anyone claiming a node's ID)
#: could otherwise write a warning per message it sends.
_bad_jobs_log: Final = RateLimitedLog(log)


def jobs_in(msg: Message, sender: ClusterNode) -> list[Job]:
    """The jobs a REPLJOB or YOURJOBS carries, as sent, with the extension
    options of the trailer after them (disque.job_options); a bad blob ends the
    list (logged: the rest of the payload cannot be trusted).

    A list rather than a generator: compiled, each resumption of a
    generator costs more than appending (a peer runs this per copy)."""
    offset = 0
    jobs: list[Job] = []
    complete = True
    for _ in range(msg.numjobs):
        try:
            job, offset = deserialize_job(msg.payload, offset)
        except SerializationError as err:
            _bad_jobs_log.warning(f"Bad job in {messages.TYPE_NAMES[msg.type].upper()} "
                                  f"from {sender.id}: {err}")
            complete = False
            break
        jobs.append(job)
    if complete and offset < len(msg.payload):
        try:
            apply_bus_trailer(jobs, msg.payload, offset)
        except ExtError as err:
            _bad_jobs_log.warning(f"Bad job options in {messages.TYPE_NAMES[msg.type].upper()} "
                                  f"from {sender.id}: {err}")
    return [job for job in jobs if job.queue is not None]


def adopt_copy(state: ServerState, job: Job, now: int) -> None:
    """A job received from another node, made this node's (not registered):
    its expiry from the time left (clocks differ; deserialize_job already
    made the blob's seconds milliseconds), active, no GC attempt yet, no
    WILLQUEUE pending, the queue's shared name."""
    job.etime = now + job.etime
    job.state = ACTIVE
    job.flags &= ~FLAG_BCAST_WILLQUEUE
    job.gc_retry = 0
    job.queue = state.queue_for_write(job.queue).name if job.queue else None


def receive_repljob(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """Store the copies of a REPLJOB and confirm them with GOTJOB."""
    if state.memory.level() >= 1 or state.cluster.leaving:
        return  # the sender will pick another node
    persistence = state.logging_persistence
    if persistence is not None and persistence.refuse_write() is not None:
        return  # the AOF cannot log the copies: no GOTJOB for what is not written
    now = state.clock.now_ms()
    cluster = state.cluster
    # One header and one sender lookup for the GOTJOBs of all the copies.
    gotjob = b"" if msg.mflags & messages.MFLAG_NOREPLY else cluster.header_key(messages.GOTJOB)
    sender_id = sender.id
    # A REPLJOB's jobs mostly share one queue: look each name up once.
    last_queue = b""
    paused = False
    for copy in jobs_in(msg, sender):
        assert copy.queue is not None  # jobs_in returns only jobs with a queue
        if copy.queue != last_queue:
            last_queue = copy.queue
            q = state.queues.lookup(last_queue)
            paused = q is not None and bool(q.flags & PAUSED_IN)
        if paused:
            continue
        job = state.jobs.get(copy.id)
        if job is not None:
            job.delivered = job.delivered | copy.delivered
            if copy.ext is not None:
                merge_copy(state, job, copy)
        elif acked_elsewhere(state, copy.id, now):
            continue  # acked and collected while this copy travelled: no GOTJOB
        else:
            _store_copy(state, copy, now)
        if gotjob:
            cluster.send_entry(sender_id, gotjob, copy.id + _NO_AUX)


#: The aux field of a GOTJOB: 0.
_NO_AUX: Final = bytes(4)


def _store_copy(state: ServerState, job: Job, now: int) -> None:
    """A new copy from another node: active, first requeue after DELAY + RETRY.

    A RETRY-0 copy waits for ENQUEUE, which gives it its queue time (the
    original's ENQUEUE refused a copy without one, so RETRY-0 copies were
    never queued).
    """
    adopt_copy(state, job, now)
    job.flags |= FLAG_BCAST_QUEUED
    ext = job.ext
    grouped = ext is not None and ext.group is not None
    if job.retry:
        job.qtime = now + (job.delay + job.retry) * 1000 + random_time_error()
        if grouped:
            job.qtime += rank_wait_ms(state, job)
        job.flags |= FLAG_BCAST_WILLQUEUE
    else:
        # At most once: only the ENQUEUE of the node that made it queues
        # this copy (two copies queueing themselves would deliver it twice).
        job.qtime = 0
    register_job(state, job)
    if grouped and job.retry:
        copy_in(state, job)
    state.events.job_stored(state, job)


def receive_enqueue(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """ENQUEUE(delay): queue our copy now, or after ``delay`` seconds."""
    job = state.jobs.get(msg.job_id)
    if job is None or job.state != ACTIVE:
        return  # unknown, queued already, acked, or ours still waiting for copies
    q = state.queues.lookup(job.queue) if job.queue is not None else None
    if q is not None and q.flags & PAUSED_IN:
        return
    job.flags &= ~FLAG_BCAST_QUEUED
    now = state.clock.now_ms()
    if msg.aux:
        job.qtime = now + msg.aux * 1000
        update_awake_time(state, job)
    else:
        job.qtime = now
        enqueue_job(state, job, now=now)


def merge_copy(state: ServerState, job: Job, copy: Job) -> None:
    """A copy of a job we hold arrived (REPLJOB, YOURJOBS): if it was
    dead-lettered elsewhere and ours not yet, move ours the same way."""
    theirs = copy.ext
    if theirs is None or not theirs.dead_from or copy.queue is None or job.state == ACKED:
        return
    ours = job.ext
    if ours is not None and ours.dead_from:
        return
    if job.state == QUEUED:
        dequeue_job(state, job)  # queued by the mover in the dead-letter queue now
    if ours is not None and ours.group is not None:
        release_group(state, job)  # it leaves its group's queue here
    moved = theirs.moved(theirs.dead_from)
    moved.nack_pending = ours.nack_pending if ours is not None else False
    # Our copy keeps its own headers and group: its share of used_memory
    # counts them (a plain copy from an original node has none, the
    # mover's may have).
    moved.headers = ours.headers if ours is not None else ()
    moved.group = ours.group if ours is not None else None
    job.ext = moved
    job.queue = state.queue_for_write(copy.queue).name
    if moved.group is not None and job.state == ACTIVE and job.retry and job.qtime:
        copy_in(state, job)  # a copy of the dead letter, in its group there
    state.events.job_moved(state, job)
