"""The node's :class:`~disque.events.JobEvents`: who learns what happened to a job.

| event | the AOF (while it logs) | others |
|---|---|---|
| ``job_stored`` | LOADJOB | |
| ``job_acked`` | the ACK record | a waiting ADDJOB gets its ID; WAITJOB +ACKED |
| ``job_moved`` | LOADJOB of the new queue | |
| ``job_dead_lettered`` | LOADJOB of the new queue | the other copies get a REPLJOB (NOREPLY) |
| ``job_unregistered`` | DELJOB | a waiting ADDJOB gets -NOREPL; WAITJOB -NOJOB |
| ``idmp_settled`` | the IDMP record | |
| ``queue_limit_changed`` | the QLIMIT record | |
| ``jobs_unclaimed`` | | offered to the nodes waiting for them (federation: YOURJOBS) |
| ``waiters_gone`` | | the other nodes forget this node's asks (federation: NEEDJOBS(0)) |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import JobEvents
from .federation import offer_jobs, withdraw_asks
from .job import ACKED
from .replication import acked_while_waiting, broadcast_repljob_noreply, replication_removed
from .waitjob import job_completed, job_removed

if TYPE_CHECKING:
    from .idmp import DedupEntry
    from .job import Job
    from .queue_table import Queue
    from .state import ServerState

__all__ = ["NodeEvents"]


class NodeEvents(JobEvents):
    def job_stored(self, state: ServerState, job: Job) -> None:
        journal = self.journal
        if journal is not None:
            journal.job_stored(job)

    def job_acked(self, state: ServerState, job: Job) -> None:
        journal = self.journal
        if journal is not None:
            journal.job_acked(job)
        if state.replicating:
            acked_while_waiting(state, job)
        job_completed(state, job.id)

    def job_moved(self, state: ServerState, job: Job) -> None:
        journal = self.journal
        if journal is not None:
            journal.job_stored(job)

    def job_dead_lettered(self, state: ServerState, job: Job) -> None:
        self.job_moved(state, job)
        if len(job.delivered) > 1:
            broadcast_repljob_noreply(state, job)

    def job_unregistered(self, state: ServerState, job: Job, removed: bool) -> None:
        if state.replicating:
            replication_removed(state, job)
        if state.job_waiters and job.state != ACKED:
            job_removed(state, job.id)
        journal = self.journal
        if removed and journal is not None:
            journal.job_forgotten(job)

    def idmp_settled(self, state: ServerState, entry: DedupEntry) -> None:
        journal = self.journal
        if journal is not None:
            journal.idmp_settled(entry)

    def queue_limit_changed(self, state: ServerState, q: Queue) -> None:
        journal = self.journal
        if journal is not None:
            limit = q.limit
            journal.queue_limit_changed(q.name, limit.max_jobs if limit is not None else 0,
                                        limit.period_ms if limit is not None else 0)

    def jobs_unclaimed(self, state: ServerState, q: Queue) -> None:
        offer_jobs(state, q)

    def waiters_gone(self, state: ServerState, q: Queue) -> None:
        withdraw_asks(state, q)
