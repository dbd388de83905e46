"""How the lower layers tell the higher ones that something happened to a job.

The node is built in layers that call only downward: the tables
(``state``, ``job_table``, ``queue_table``, ``waiters``), then the spec's
procedures (``queue``, ``jobs``, ``ack``, ``replication``, ``copies``,
``requeue``, ``federation``, ``timers``), then the commands, then the edges
(connections, the server, the AOF).  Where a low procedure must tell a
higher one, it calls the one :class:`JobEvents` object the state holds:
``unregister_job`` does not import replication to fail a waiting ADDJOB, it
reports ``job_unregistered`` and the node's implementation
(``node_events.NodeEvents``) decides who needs to know.

A native base class rather than a Protocol: compiled, a call is a vtable
call, not a Python-level attribute lookup (the pattern of ``waiters.Blocked``).

:class:`Journal` is what the events tell the append-only file while it logs
job records, and :class:`Persistence` what the command layer and the server
ask of it; the AOF (``aof/``) implements both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .idmp import DedupEntry
    from .job import Job
    from .protocol import ReplyError
    from .queue_table import Queue
    from .state import ServerState

__all__ = ["JobEvents", "Journal", "Persistence"]


class Journal(Protocol):
    """The AOF while it logs job records."""

    def job_stored(self, job: Job) -> None:
        """A copy of the job was first stored here (LOADJOB)."""

    def job_acked(self, job: Job) -> None:
        """The job was acknowledged here (its record becomes an ACK)."""

    def job_forgotten(self, job: Job) -> None:
        """The job left this node (DELJOB)."""

    def idmp_settled(self, entry: DedupEntry) -> None:
        """An IDMP key became final (its ADDJOB answered with the ID)."""

    def queue_limit_changed(self, name: bytes, max_jobs: int, period_ms: int) -> None:
        """A queue's rate limit was set (``max_jobs`` 0: removed)."""


class Persistence(Protocol):
    """The AOF as the command table, the reply writer and the server use it."""

    def before_reply(self) -> None:
        """Write (and with ``appendfsync always`` sync) what the turn logged."""

    def refuse_write(self) -> ReplyError | None:
        """-MISCONF while the file cannot take new records (a write command,
        an ADDJOB whose copies arrived, a copy offered by REPLJOB), else None."""

    def can_log(self) -> bool:
        """Whether records made now can be written (``refuse_write`` without
        the reply): the ACK garbage collection asks before it confirms or
        completes an ACK."""

    def after_command(self, reply: Any) -> Any:
        """The reply of a write command, once its records are written."""

    def cron(self) -> None:
        """Periodic work: background fsync, automatic rewrites."""

    @property
    def rewriting(self) -> bool:
        """A rewrite is under way."""

    def start_rewrite(self, why: str, raise_errors: bool = False) -> bool:
        """BGREWRITEAOF: False if it could not start."""

    def shutdown(self, mode: str) -> None:
        """SHUTDOWN [REWRITE-AOF]: write, sync and close."""

    def info_fields(self) -> list[tuple[str, object]]:
        """INFO persistence."""


class JobEvents:
    """What happened to a job, told to the layers above the procedures.

    Every method is called with the state first, as the procedures are.
    ``journal`` is the AOF while it logs job records (None otherwise), so a
    node without persistence pays one attribute test per event.
    """

    __slots__ = ("journal",)

    def __init__(self) -> None:
        self.journal: Journal | None = None

    def job_stored(self, state: ServerState, job: Job) -> None:
        """A copy of the job was first stored on this node."""
        raise NotImplementedError

    def job_acked(self, state: ServerState, job: Job) -> None:
        """The job was acknowledged on this node (it was not acked before)."""
        raise NotImplementedError

    def job_moved(self, state: ServerState, job: Job) -> None:
        """A stored job changed queue: dead-lettered by another node's copy."""
        raise NotImplementedError

    def job_dead_lettered(self, state: ServerState, job: Job) -> None:
        """This node moved the job to its dead-letter queue: the copies must learn."""
        raise NotImplementedError

    def job_unregistered(self, state: ServerState, job: Job, removed: bool) -> None:
        """The job left this node (``removed``: it was in the job table)."""
        raise NotImplementedError

    def idmp_settled(self, state: ServerState, entry: DedupEntry) -> None:
        """An IDMP key became final."""
        raise NotImplementedError

    def queue_limit_changed(self, state: ServerState, q: Queue) -> None:
        """A queue's rate limit was set or removed (QLIMIT)."""
        raise NotImplementedError

    def waiters_gone(self, state: ServerState, q: Queue) -> None:
        """The last GETJOB waiting on ``q`` left (answered, timed out or gone)
        while other nodes keep an ask of this node for ``q`` (``q.fed.asked``)."""
        raise NotImplementedError

    def jobs_unclaimed(self, state: ServerState, q: Queue) -> None:
        """Jobs were queued in ``q`` with no local consumer waiting for them,
        while other nodes wait for jobs (``state.queues.asks`` is not empty)."""
        raise NotImplementedError
