"""Bulk actions over a filter, and redrive: long tasks at a chosen rate, with progress.

A task walks one queue's jobs on every node (``JSCAN ... QUEUE q``), keeps
those its filter matches, and acts on them a batch at a time, no faster
than its rate (jobs per second), so that it cannot flood the cluster; the
walk itself examines at most SCAN_FACTOR times that many jobs a second
(JSCAN walks a node's whole job table, whatever the queue):

* ``redrive``: the jobs of a dead-letter queue go back to the queue each
  died in (SHOW's ``dead-lettered-from``) or to ``to``, like SQS's
  ``StartMessageMoveTask``;
* ``move``: the queued jobs of a queue go to the queue ``to``;
* ``enqueue``, ``dequeue``, ``delete``: ``ENQUEUE`` on the node holding the
  job, ``DEQUEUE`` or ``DELJOB`` on every node.

**How a job moves** (``redrive`` and ``move``): Disque has no command that
changes a job's queue, so a move is a new job in the target queue and the
old one acknowledged.  Done naively, a crash between the two loses the job
or delivers it twice, and a consumer of the source queue may take it
meanwhile.  Each job goes through four steps instead:

1. **claim**: ``DEQUEUE id`` on the node where the job is queued, then
   ``WORKING id`` there.  DEQUEUE answers 1 only if the job was still
   queued there: a consumer that took it first keeps it, and the task skips
   it.  A claimed job is *active*: if nothing else happens, a node queues
   it again at its next requeue time, so a claim never loses a job.
   DEQUEUE leaves that time where it was (anywhere up to RETRY away);
   WORKING pushes it to RETRY from now on every copy (the node answers the
   seconds; its jitter takes up to 0.25 s off), which is the claim's
   *hold*.  The task renews the hold (WORKING again, on connections of its
   own, half-way through) while the move is pending, and never sends an
   ADDJOB whose timeout would end after the hold, so the ACKJOB that
   follows comes while no copy can have been queued again.  A hold that
   lapsed anyway (a node out of reach) is never renewed: the claim is
   checked (SHOW on every node) before anything else is done with it.
   Past half its TTL a job's node answers WORKING with TOOLATE: such a job
   cannot be held, so it is left to come back to its queue by itself
   (counted as failed, and said).  A job of RETRY 0 is never queued again:
   no hold is needed, and a resume finishes its claim.
2. **journal** the claim (old ID, the node it was claimed on, the node that
   takes the ADDJOB, the target queue, the time, and whether that node
   keeps IDMP keys over a restart: AOF on, and its run ID), and fsync it.
3. **add**: ``ADDJOB target body ... IDMP moved:<old id> IDMP-WINDOW
   86400`` with the old job's TTL left, RETRY, delivery options and
   priority, replicated synchronously.  IDMP makes the ADDJOB idempotent: a
   repeat with the same key in that queue, within the day, answers the
   first job's ID and adds nothing.  The key lives on the node that took
   the first ADDJOB only, so each job's ADDJOB always goes to the same
   node: the old job's creator (its ID names it), else the first node that
   answers, and the journal records which.  Its success is journaled and
   fsynced before step 4.  One that fails for a while (-IDMPBUSY, -NOREPL,
   no answer) is sent again at the next batch, its claim held meanwhile.
4. **acknowledge** the old job (``ACKJOB``, which removes its copies
   cluster-wide), and journal it done.

A crash (of the console, the CLI, a node's connection) at any point leaves
either nothing done (the claim lapses: the job is queued again after its
RETRY), or the claim journaled and the ADDJOB unknown, or the new job added
and the old one still there.  Resuming (the journal's claims first, then a
new pass) checks each claim, repeats step 3, which adds nothing the second
time, then step 4.  A claim whose IDMP key may be gone (claimed longer ago
than the window, or its ADDJOB node restarted without AOF since) and whose
ADDJOB is not known to have happened is neither added again nor
acknowledged: the task lists it (``unverified``) with what the operator
must check.  Without a journal (the CLI without ``--journal``), a rerun
picks the same node (the creator) and the old job comes back to its queue
after RETRY, so the same holds unless the creator's reachability changed
between the runs.

The ``enqueue``, ``dequeue`` and ``delete`` actions need none of this: each
is idempotent on its own (a job already queued, dequeued or deleted is
counted as skipped), so a resumed task simply walks the queue again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from disque.client import (
    AsyncClient,
    DisqueError,
    IdmpBusy,
    NoRepl,
    PipelineReplies,
    ResponseError,
    TooLate,
)

from .audit import audit_log
from .nodes import Credentials, Node, Pool, Problem
from .replies import encode, number, pairs, text
from .settings import Settings
from .shows import show_one, show_pipeline

__all__ = ["KINDS", "MOVES", "TaskSpec", "SpecError", "Counts", "Claim", "Journal", "Task",
           "TaskManager", "idmp_key", "DEFAULT_RATE", "MAX_RATE", "IDMP_WINDOW"]

log = logging.getLogger("disque.console")
T = TypeVar("T")

KINDS = ("redrive", "move", "enqueue", "dequeue", "delete")
#: The kinds that move jobs to another queue (claim, add, acknowledge).
MOVES = ("redrive", "move")
JOB_STATES = ("queued", "active", "acked", "wait-repl")
DEFAULT_RATE = 100.0
#: The fastest a task may go: jobs per second.
MAX_RATE = 10_000.0
#: Seconds an ADDJOB's IDMP key protects a move against its own repetition.
IDMP_WINDOW = 86_400
#: Milliseconds a node may take to replicate a moved job (ADDJOB's timeout).
ADD_TIMEOUT_MS = 10_000
#: Jobs one JSCAN call is asked for (at most: a slow task asks for fewer).
SCAN_COUNT = 200
#: A task's walk examines at most this many times its rate in jobs a second
#: (JSCAN walks a node's whole job table, COUNT slots a call, whatever the
#: queue), and never fewer than SCAN_FLOOR: a filter that matches little
#: does not turn a slow task into back-to-back scans.
SCAN_FACTOR = 20
SCAN_FLOOR = 2_000.0
#: Seconds of a WORKING's hold given up to the node's jitter: a WORKING of
#: RETRY r puts the job's next requeue between r - 0.25 and r + 0.25 s
#: later on every copy (schedule.requeue_time); a little more for the bus.
HOLD_MARGIN = 0.3
#: Seconds of a hold kept for the ACKJOB after an ADDJOB answers.
ACK_MARGIN = 0.15
#: The shortest ADDJOB timeout worth sending (ms); a claim held for less
#: is renewed (WORKING) first.
MIN_ADD_MS = 100
#: Seconds between two state checks (SHOW on every node) of a claim that
#: is not held (its hold lapsed, or it comes from a journal).
CHECK_SPACING = 1.0
#: A journaled claim older than the IDMP window less this many seconds is
#: not added again blindly: its key may be gone.
IDMP_MARGIN = 300
#: Seconds the end of a task keeps retrying claims that could not finish.
SETTLE_SECONDS = 30.0
#: A journal file larger than this is rewritten to what is still needed.
JOURNAL_COMPACT_BYTES = 4 * 1024 * 1024
DEAD_SUFFIX = ":dead"


class SpecError(ValueError):
    """A task's parameters that do not parse; the message says which."""


def idmp_key(old_id: str) -> str:
    """The IDMP key of the ADDJOB that moves job ``old_id``."""
    return f"moved:{old_id}"


@dataclass(frozen=True)
class TaskSpec:
    """What a task does: its kind, queue, filter and rate."""

    kind: str
    queue: str
    #: The target queue of a move; for a redrive, "" sends each job back
    #: to the queue it died in.
    to: str = ""
    #: Only jobs in this state ("" any; moves take queued jobs only).
    state: str = ""
    #: Only jobs whose body contains this text.
    contains: str = ""
    #: Only jobs dead-lettered from a queue matching this glob.
    origin: str = ""
    #: At most this many jobs acted on (0: no limit).
    limit: int = 0
    rate: float = DEFAULT_RATE

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> TaskSpec:
        """From a form or JSON object; :class:`SpecError` names what is wrong."""
        def field_text(name: str, longest: int = 1024) -> str:
            value = values.get(name)
            raw = "" if value is None else str(value)
            if len(raw) > longest:
                raise SpecError(f"{name} is longer than {longest} characters")
            return raw

        kind = field_text("kind", 20) or field_text("op", 20)
        if kind not in KINDS:
            raise SpecError(f"the action must be one of {', '.join(KINDS)}")
        queue = field_text("queue")
        if not queue:
            raise SpecError("name the queue to act on")
        to = field_text("to").strip()
        if kind == "move" and not to:
            raise SpecError("a move needs the queue to move the jobs to")
        if to and to == queue:
            raise SpecError("the target queue must not be the queue the jobs are in")
        state = field_text("state", 20)
        if state and state not in JOB_STATES:
            raise SpecError(f"state must be one of {', '.join(JOB_STATES)}")
        if kind in MOVES:
            if state not in ("", "queued"):
                raise SpecError("only queued jobs can be moved (a delivered job belongs to "
                                "its consumer until it is acknowledged or queued again)")
            state = "queued"
        raw_limit = field_text("limit", 20).strip()
        if raw_limit and not raw_limit.isdigit():
            raise SpecError(f"limit must be a whole number, not {raw_limit!r}")
        raw_rate = field_text("rate", 20).strip()
        try:
            rate = float(raw_rate) if raw_rate else DEFAULT_RATE
        except ValueError:
            raise SpecError(f"rate must be a number of jobs per second, not {raw_rate!r}"
                            ) from None
        if not 0.1 <= rate <= MAX_RATE:
            raise SpecError(f"rate must be between 0.1 and {MAX_RATE:.0f} jobs per second")
        return cls(kind=kind, queue=queue, to=to, state=state, contains=field_text("contains"),
                   origin=field_text("origin"), limit=int(raw_limit or 0), rate=rate)

    @property
    def needs_bodies(self) -> bool:
        """Whether the scan must return whole jobs (a move, or a filter on them)."""
        return self.kind in MOVES or bool(self.contains or self.origin)

    @property
    def batch(self) -> int:
        """Jobs per batch: about ten batches a second, at most 100 jobs each."""
        return max(1, min(100, int(self.rate / 10)))

    def matches(self, fields: dict[str, Any] | None) -> bool:
        if fields is None:
            return not (self.contains or self.origin)
        if self.contains:
            body = fields.get("body")
            if not isinstance(body, bytes) or self.contains.encode(
                    "utf-8", "surrogateescape") not in body:
                return False
        if self.origin:
            origin = text(fields.get("dead-lettered-from"))
            if not origin or not fnmatch.fnmatchcase(origin, self.origin):
                return False
        return True

    def target_of(self, fields: dict[str, Any]) -> str | None:
        """Where a moved job goes; None: nowhere known (a redrive of a job
        that carries no origin, without ``to``)."""
        if self.to:
            return self.to
        if self.kind == "move":
            return None
        origin = text(fields.get("dead-lettered-from"))
        return origin or None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "queue": self.queue, "to": self.to, "state": self.state,
                "contains": self.contains, "origin": self.origin, "limit": self.limit,
                "rate": self.rate}

    def same_work(self, other: TaskSpec) -> bool:
        """The same jobs and action (the rate may differ): a journal's task resumes."""
        return replace(self, rate=other.rate) == other

    def describe(self) -> str:
        """The parameters an audit line names."""
        parts = [f"to={self.to or '<origin>'}" if self.kind in MOVES
                 else f"state={self.state or 'any'}"]
        parts += [f"{k}={v!r}" for k, v in (("contains", self.contains),
                                            ("origin", self.origin)) if v]
        if self.limit:
            parts.append(f"limit={self.limit}")
        parts.append(f"rate={self.rate:g}")
        return " ".join(p for p in parts if p)


@dataclass
class Counts:
    """What a task did so far."""

    #: Jobs there were to look at when it started (QLEN summed for queued
    #: jobs, else counted with an ID-only JSCAN), None before it knows.
    total: int | None = None
    #: Jobs looked at.
    examined: int = 0
    #: Jobs acted on: moved, enqueued, dequeued or deleted.
    done: int = 0
    #: Jobs the filter left alone.
    unmatched: int = 0
    #: Jobs that needed nothing, or that a consumer took first.
    skipped: int = 0
    #: Jobs the nodes refused (put back where they were, for a move).
    failed: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"total": self.total, "examined": self.examined, "done": self.done,
                "unmatched": self.unmatched, "skipped": self.skipped, "failed": self.failed}


@dataclass
class Claim:
    """A job taken out of its queue to be moved, until it is done."""

    old: str
    #: The node it was claimed on (DEQUEUE), where it is acknowledged.
    source: str
    #: The node its ADDJOB goes to, always the same one (its IDMP key is there).
    add_on: str
    target: str
    #: The ADDJOB, once known (a claim read back from a journal has none:
    #: it is rebuilt from SHOW).
    command: list[str | bytes | int] | None = None
    #: The new job's ID, once added.
    new: str | None = None
    #: The old job's RETRY (seconds; 0: at most once, never queued again),
    #: None while unknown.
    retry: int | None = None
    #: ``time.monotonic()`` until which no copy of the old job can be queued
    #: again: our WORKING's hold.  0: not known to be held (its hold lapsed,
    #: or it comes from a journal), which only a state check (SHOW) settles;
    #: ``inf`` for a job of RETRY 0, which nothing queues again.
    held_until: float = 0.0
    #: When the hold is renewed (half of it gone).
    renew_at: float = 0.0
    #: ``time.time()`` of the claim, journaled: the IDMP key of its ADDJOB
    #: lasts IDMP_WINDOW from the first ADDJOB, which comes after.
    claimed_at: float = field(default_factory=time.time)
    #: Whether the ADDJOB node keeps its IDMP keys over a restart (AOF on),
    #: and its run ID then (INFO): a node restarted without AOF forgot them.
    persists: bool | None = None
    run_id: str | None = None
    #: ``time.monotonic()`` of the last state check.
    checked_at: float = 0.0
    #: False for a resumed claim until :meth:`Task._verify` trusts its IDMP key.
    verified: bool = True
    #: WORKING answered TOOLATE (past half the TTL): no longer held.
    late: bool = False

    def record(self) -> dict[str, Any]:
        return {"r": "claim", "old": self.old, "source": self.source, "add_on": self.add_on,
                "target": self.target, "t": round(self.claimed_at, 3), "aof": self.persists,
                "run": self.run_id}

    def hold(self, sent: float, seconds: int) -> None:
        """A WORKING sent at ``sent`` answered ``seconds``: held until then."""
        if seconds <= 0:
            self.held_until = self.renew_at = float("inf")
            return
        length = max(0.0, seconds - HOLD_MARGIN)
        self.held_until = sent + length
        self.renew_at = sent + length / 2

    def held(self, now: float, ahead: float = 0.0) -> bool:
        return self.held_until > now + ahead


class Journal:
    """A task's progress, appended as JSON lines; in memory only without a path.

    Records: ``start`` (the task), ``claim``/``added``/``done``/``back`` (a
    moved job's steps), ``progress`` (the counters) and ``state``.  Claims
    are fsynced before their ADDJOB is sent; the rest is written as it
    comes.  A file past a few megabytes is rewritten to the start, the
    counters and the claims not yet done.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._size = path.stat().st_size if path is not None and path.exists() else 0

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        records = []
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash mid-write
                if isinstance(record, dict):
                    records.append(record)
        return records

    def append(self, records: Iterable[dict[str, Any]], sync: bool = False) -> None:
        if self.path is None:
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        if not data:
            return
        with self.path.open("a", encoding="utf-8") as out:
            out.write(data)
            if sync:
                out.flush()
                os.fsync(out.fileno())
        self._size += len(data)

    @property
    def too_big(self) -> bool:
        return self._size > JOURNAL_COMPACT_BYTES

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        """Replace the file with ``records`` (atomically)."""
        if self.path is None:
            return
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        self._size = self.path.stat().st_size


@dataclass
class Resumed:
    """What a journal says about a task that did not finish."""

    task_id: str
    spec: TaskSpec
    user: str
    created: float
    counts: Counts
    state: str
    claims: dict[str, Claim] = field(default_factory=dict)
    added: dict[str, str] = field(default_factory=dict)
    #: Moves a resume could not verify (see :meth:`Task._verify_resumed`).
    unverified: list[dict[str, Any]] = field(default_factory=list)


def replay(records: list[dict[str, Any]]) -> Resumed | None:
    """A journal's records as the task they describe (None: no start record)."""
    start = next((r for r in records if r.get("r") == "start"), None)
    if start is None:
        return None
    try:
        spec = TaskSpec.parse(start["spec"])
    except (SpecError, KeyError, TypeError):
        return None
    resumed = Resumed(str(start.get("id", "")), spec, str(start.get("user", "default")),
                      float(start.get("created", 0) or 0), Counts(), "interrupted")
    done = 0
    for record in records:
        kind = record.get("r")
        old = str(record.get("old", ""))
        if kind == "claim":
            claim = Claim(old, str(record.get("source", "")), str(record.get("add_on", "")),
                          str(record.get("target", "")))
            # Journals written before these fields: the claim time and the
            # node's persistence are unknown (then not held against it).
            t = record.get("t")
            claim.claimed_at = float(t) if isinstance(t, int | float) else 0.0
            aof = record.get("aof")
            claim.persists = aof if isinstance(aof, bool) else None
            run = record.get("run")
            claim.run_id = run if isinstance(run, str) else None
            resumed.claims[old] = claim
        elif kind == "added":
            resumed.added[old] = str(record.get("new", ""))
        elif kind in ("done", "back"):
            resumed.claims.pop(old, None)
            resumed.added.pop(old, None)
        elif kind == "unverified":
            resumed.claims.pop(old, None)
            resumed.added.pop(old, None)
            resumed.unverified.append({k: record.get(k) for k in ("old", "target", "add_on",
                                                                  "why")})
        elif kind == "progress":
            counts = record.get("counts") or {}
            total = counts.get("total")
            resumed.counts = Counts(total=total if isinstance(total, int) else None, **{
                k: int(counts.get(k) or 0) for k in ("examined", "done", "unmatched",
                                                     "skipped", "failed")})
            done = resumed.counts.done
        elif kind == "state":
            resumed.state = str(record.get("state", "interrupted"))
    resumed.counts.done = max(resumed.counts.done, done)
    for old, new in resumed.added.items():
        if old in resumed.claims:
            resumed.claims[old].new = new
    if resumed.state in ("running", "paused", "waiting"):
        resumed.state = "interrupted"  # its process went away mid-task
    return resumed


def _pipeline(commands: list[list[str | bytes | int]], wait: float = ADD_TIMEOUT_MS / 1000
              ) -> Callable[[AsyncClient], Awaitable[PipelineReplies]]:
    payload, count = encode(commands), len(commands)

    async def call(client: AsyncClient) -> PipelineReplies:
        return await client.send_pipeline(lambda _node: (payload, count), wait=wait)
    return call


def _command(args: list[str | int]) -> Callable[[AsyncClient], Awaitable[Any]]:
    async def call(client: AsyncClient) -> Any:
        return await client.execute_command(*args)
    return call


def _too_late(reply: Any) -> bool:
    """WORKING's refusal past half the job's TTL: it can no longer be held."""
    return isinstance(reply, TooLate)


def _is_syntax_error(reply: Any) -> bool:
    """An original node's answer to ``IDMP``: it has no idempotent ADDJOB."""
    return isinstance(reply, ResponseError) and "syntax error" in str(reply).lower()


class Task:
    """One bulk action or redrive, run as ``user`` through ``pool``."""

    def __init__(self, task_id: str, spec: TaskSpec, user: str, pool: Pool,
                 journal: Journal, created: float | None = None,
                 resumed: Resumed | None = None) -> None:
        self.id = task_id
        self.spec = spec
        self.user = user
        self.pool = pool
        self.journal = journal
        self.created = created or time.time()
        self.state = "waiting"
        self.counts = resumed.counts if resumed else Counts()
        self.in_flight: dict[str, Claim] = dict(resumed.claims) if resumed else {}
        self.problems: deque[str] = deque(maxlen=8)
        self.started: float | None = None
        self.finished: float | None = None
        self._cancelled = False
        self._running = asyncio.Event()
        self._running.set()
        self._wake = asyncio.Event()
        self._next_batch = 0.0
        #: Job IDs acted on by enqueue/dequeue/delete (a job has copies on
        #: several nodes; each is scanned there).
        self._seen: set[str] = set()
        #: Nodes that answered IDMP with a syntax error (original nodes).
        self._no_idmp: set[str] = set()
        self._nodes: list[Node] = []
        self._paused_at: float | None = None
        self._paused_for = 0.0
        #: Nodes whose walk could not even start (down, or a refusal).
        self._refused = 0
        #: The walk's pace: jobs of the nodes' tables examined per second.
        self._scan_rate = max(SCAN_FACTOR * spec.rate, SCAN_FLOOR)
        self._next_scan = 0.0
        #: Jobs found past half their TTL (WORKING refused): left where they are.
        self._too_late: set[str] = set()
        #: address -> (AOF on, run ID, monotonic time asked): the ADDJOB nodes'.
        self._facts: dict[str, tuple[bool | None, str | None, float]] = {}
        #: Moves a resume could not verify: what the operator must check.
        self.unverified: list[dict[str, Any]] = list(resumed.unverified) if resumed else []
        #: A resume's claims are checked (_verify_resumed) before anything else.
        self._resumed = resumed is not None
        self._estimating: asyncio.Task[None] | None = None
        #: Connections of their own for WORKING renewals: an ADDJOB waiting
        #: for its copies holds up every command behind it on its connection.
        self._holder = Pool(pool.seeds, pool.credentials, pool.settings)
        self._keeper: asyncio.Task[None] | None = None
        self._claims_changed = asyncio.Event()
        if resumed is None:
            self.journal.append([{"r": "start", "id": task_id, "user": user,
                                  "created": self.created, "spec": spec.as_json()}], sync=True)

    # ------------------------------------------------------------- control

    def pause(self) -> bool:
        if self.state != "running":
            return False
        self._running.clear()
        self.state = "paused"
        self._paused_at = time.monotonic()
        self.journal.append([{"r": "state", "state": "paused"}])
        return True

    def resume(self) -> bool:
        if self.state != "paused":
            return False
        self._running.set()
        self._wake.set()
        self.state = "running"
        if self._paused_at is not None:
            self._paused_for += time.monotonic() - self._paused_at
            self._paused_at = None
        self.journal.append([{"r": "state", "state": "running"}])
        return True

    def cancel(self) -> bool:
        if self.state not in ("running", "paused", "waiting"):
            return False
        self._cancelled = True
        self._running.set()
        self._wake.set()
        return True

    @property
    def active(self) -> bool:
        return self.state in ("waiting", "running", "paused")

    def _stopping(self) -> bool:
        return self._cancelled or (self.spec.limit > 0 and self.counts.done >= self.spec.limit)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, woken early by a cancel or a resume."""
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _idle(self, seconds: float) -> None:
        """Wait ``seconds`` (less after a cancel or a resume); the keeper
        renews the holds of the claims in flight meanwhile."""
        if not self._cancelled:
            await self._sleep(seconds)

    async def _gate(self) -> None:
        """Wait while paused (the keeper holds the claims in flight meanwhile)."""
        await self._running.wait()

    async def _throttle(self, jobs: int) -> None:
        """Hold the next ``jobs`` back so that the task keeps to its rate."""
        now = time.monotonic()
        if self._next_batch > now:
            await self._idle(self._next_batch - now)
        self._next_batch = max(self._next_batch, time.monotonic()) + jobs / self.spec.rate

    @property
    def _scan_count(self) -> int:
        """Jobs one JSCAN call examines: about a quarter of a second's worth."""
        return max(10, min(SCAN_COUNT, int(self._scan_rate / 4)))

    async def _pace_scan(self, slots: int) -> None:
        """Hold the next JSCAN back so that the walk examines no more than
        ``_scan_rate`` jobs a second (each call examines ``slots`` of the
        node's job table, whatever the queue and however few match)."""
        now = time.monotonic()
        if self._next_scan > now:
            await self._idle(self._next_scan - now)
        self._next_scan = max(self._next_scan, time.monotonic()) + slots / self._scan_rate

    def _problem(self, message: str) -> None:
        if not self.problems or self.problems[-1] != message:
            self.problems.append(message)
            log.warning("task %s: %s", self.id, message)

    # -------------------------------------------------------------- report

    def as_json(self) -> dict[str, Any]:
        counts = self.counts
        elapsed = None
        if self.started is not None:
            paused = self._paused_for + (time.monotonic() - self._paused_at
                                         if self._paused_at is not None else 0.0)
            elapsed = max(0.0, (self.finished or time.time()) - self.started - paused)
        # Jobs dealt with (acted on, skipped, refused, or left by the filter),
        # of those there were at the start; consumers may take some meanwhile,
        # so a finished task is at 100% whatever the count.
        total = counts.total
        dealt = counts.done + counts.skipped + counts.failed + counts.unmatched
        if self.state == "finished":
            percent = 100.0
        elif total:
            percent = min(100.0, 100.0 * dealt / total)
        else:
            percent = 0.0
        return {"id": self.id, "user": self.user, **self.spec.as_json(), "state": self.state,
                "counts": counts.as_json(), "in_flight": len(self.in_flight),
                "percent": round(percent, 1), "elapsed": round(elapsed, 1) if elapsed else 0,
                "rate_now": round(counts.done / elapsed, 1) if elapsed else 0.0,
                "created": self.created, "problems": list(self.problems),
                "unverified": self.unverified[:50]}

    def summary(self) -> str:
        c = self.counts
        verb = {"redrive": "moved", "move": "moved", "enqueue": "enqueued",
                "dequeue": "dequeued", "delete": "deleted"}[self.spec.kind]
        parts = [f"{verb} {c.done}"]
        for label, value in (("skipped", c.skipped), ("not matching", c.unmatched),
                             ("failed", c.failed), ("in flight", len(self.in_flight)),
                             ("to check", len(self.unverified))):
            if value:
                parts.append(f"{label} {value}")
        return ", ".join(parts)

    def _audit(self, result: str) -> None:
        audit_log.info("user=%s action=%s target=queue:%s %s task=%s result=%s", self.user,
                       self.spec.kind, self.spec.queue, self.spec.describe(), self.id, result)

    def _checkpoint(self) -> None:
        self.journal.append([{"r": "progress", "counts": self.counts.as_json()}])
        if self.journal.too_big:
            self.journal.rewrite([
                {"r": "start", "id": self.id, "user": self.user, "created": self.created,
                 "spec": self.spec.as_json()},
                {"r": "progress", "counts": self.counts.as_json()},
                *[c.record() for c in self.in_flight.values()],
                *[{"r": "added", "old": c.old, "new": c.new} for c in self.in_flight.values()
                  if c.new],
                *[{"r": "unverified", **u} for u in self.unverified],
            ])

    # ----------------------------------------------------------------- run

    async def run(self) -> None:
        """Walk the queue on every node and act; never raises (a failure is the state)."""
        self.state = "running"
        self.started = time.time()
        self.journal.append([{"r": "state", "state": "running"}])
        self._audit("started")
        self._keeper = asyncio.get_running_loop().create_task(self._keep())
        try:
            self._nodes = await self.pool.nodes()
            # QLEN first: JSCAN hides another team's jobs without a word, QLEN
            # says NOPERM, and a task nobody may run fails at once, saying why.
            lengths = await self.pool.each(lambda c: c.qlen(self.spec.queue), self._nodes)
            refusals = [a for a in lengths if a.problem is not None
                        and a.problem.kind == "noperm"]
            if refusals and len(refusals) == len(lengths):
                self._problem(f"{refusals[0].problem}")
                self.state = "failed"
                return
            if self.counts.total is None:
                found = [a.value for a in lengths if a.value is not None]
                if self.spec.state == "queued":
                    self.counts.total = self._capped(sum(found) if found else None)
                else:
                    # Counting means a walk of its own, paced like the task's:
                    # it runs beside the task, whose total is known once it ends.
                    self._estimating = asyncio.get_running_loop().create_task(
                        self._estimate())
            if self.in_flight:
                await self._settle_resumed()
            for node in self._nodes:
                if self._stopping():
                    break
                await self._walk(node)
            await self._settle(SETTLE_SECONDS)
            if self._cancelled:
                self.state = "cancelled"
            elif self._nodes and self._refused == len(self._nodes):
                self.state = "failed"  # no node let the task see the queue
            else:
                self.state = "finished"
        except asyncio.CancelledError:
            self.state = "interrupted"
            raise
        except Exception as exc:  # a task fails alone; the console goes on
            log.exception("task %s failed", self.id)
            self._problem(f"{type(exc).__name__}: {exc}")
            self.state = "failed"
        finally:
            for helper in (self._estimating, self._keeper):
                if helper is not None:
                    helper.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await helper
            if self.counts.total is None and self.state == "finished":
                # The count did not finish first: the walk saw every job
                # (each once: copies are counted once).
                self.counts.total = self._capped(self.counts.examined)
            self.finished = time.time()
            self._checkpoint()
            self.journal.append([{"r": "state", "state": self.state}], sync=True)
            ok = self.state == "finished" and not self.counts.failed and not self.in_flight
            self._audit(f"{'ok' if ok else self.state} ({self.summary()})")
            await self.pool.close()
            await self._holder.close()

    def _capped(self, total: int | None) -> int | None:
        if total is not None and self.spec.limit and not (self.spec.contains or
                                                          self.spec.origin):
            total = min(total, self.spec.limit)
        return total

    async def _estimate(self) -> None:
        """How many jobs there are to look at: their IDs counted on every
        node (a job has copies on several), at the walk's pace."""
        seen: set[str] = set()
        for node in self._nodes:
            cursor = 0
            while True:
                await self._pace_scan(self._scan_count)
                args: list[str | int] = ["JSCAN", cursor, "COUNT", self._scan_count, "QUEUE",
                                         self.spec.queue]
                if self.spec.state:
                    args += ["STATE", self.spec.state]
                answer = await self.pool.on(node, _command([*args, "REPLY", "id"]))
                if not isinstance(answer.value, list) or len(answer.value) != 2:
                    break  # the walk says why
                seen.update(text(i) for i in answer.value[1] or [])
                cursor = number(answer.value[0])
                if cursor == 0:
                    break
        self.counts.total = self._capped(len(seen))

    async def _walk(self, node: Node) -> None:
        """Every job of the queue on ``node``, in JSCAN pages, acted on in batches."""
        cursor = 0
        first = True
        while True:
            await self._pace_scan(self._scan_count)
            await self._gate()
            if self._stopping():
                return
            args: list[str | int] = ["JSCAN", cursor, "COUNT", self._scan_count, "QUEUE",
                                     self.spec.queue]
            if self.spec.state:
                args += ["STATE", self.spec.state]
            args += ["REPLY", "all" if self.spec.needs_bodies else "id"]
            answer = await self.pool.on(node, _command(args))
            if answer.problem is not None or not isinstance(answer.value, list) or len(
                    answer.value) != 2:
                problem = answer.problem or Problem("error", "an odd JSCAN reply")
                self._problem(f"{node.address}: {problem.message} (its jobs were left alone)")
                if first:
                    self._refused += 1
                return
            first = False
            next_cursor = number(answer.value[0])
            jobs: list[tuple[str, dict[str, Any] | None]] = []
            for entry in answer.value[1] or []:
                if self.spec.needs_bodies:
                    fields = pairs(entry)
                    if fields is not None:
                        jobs.append((text(fields.get("id")), fields))
                else:
                    jobs.append((text(entry), None))
            matched = []
            for job_id, fields in jobs:
                if self.spec.kind not in MOVES:
                    if job_id in self._seen:
                        continue  # another copy of a job already handled
                    self._seen.add(job_id)
                elif job_id in self._too_late:
                    continue  # found again elsewhere: still too old to hold
                self.counts.examined += 1
                if self.spec.matches(fields):
                    matched.append((job_id, fields))
                else:
                    self.counts.unmatched += 1
            for start in range(0, len(matched), self.spec.batch):
                batch = matched[start:start + self.spec.batch]
                if self.spec.limit:
                    batch = batch[:max(0, self.spec.limit - self.counts.done
                                       - len(self.in_flight))]
                await self._throttle(len(batch))
                # Paused meanwhile: the page may be stale, which is harmless
                # (a move claims each job first; the other actions act on
                # what the job is now).
                await self._gate()
                if self._stopping():
                    return
                if self.spec.kind in MOVES and self.in_flight:
                    # The moves an earlier batch could not finish: now, not
                    # at the end of the walk.
                    await self._tend()
                await self._apply(node, batch)
                self._checkpoint()
            if next_cursor == 0:
                return
            cursor = next_cursor

    async def _apply(self, node: Node, batch: list[tuple[str, dict[str, Any] | None]]) -> None:
        if self.spec.kind in MOVES:
            await self._move(node, batch)
            return
        if self.spec.kind == "enqueue" or self.spec.state not in ("", "queued"):
            # A job is queued on one node and its copies elsewhere are
            # "active": a copy's own state is not the job's.  A job queued
            # elsewhere is not active (the filter), nor to be queued a second
            # time (ENQUEUE acts on one node's copy).
            queued = await self._queued_elsewhere([job_id for job_id, _ in batch], node)
            if queued:
                if self.spec.state not in ("", "queued"):
                    self.counts.unmatched += len(queued)
                else:
                    self.counts.skipped += len(queued)
                batch = [(i, f) for i, f in batch if i not in queued]
            if not batch:
                return
        if self.spec.kind == "enqueue":
            await self._each_id(batch, [node], "ENQUEUE")
        elif self.spec.kind == "dequeue":
            await self._each_id(batch, self._nodes, "DEQUEUE")
        else:
            await self._each_id(batch, self._nodes, "DELJOB")

    async def _queued_elsewhere(self, ids: list[str], node: Node) -> set[str]:
        """The jobs of ``ids`` queued on another node than ``node`` (SHOW there)."""
        others = [n for n in self._nodes if n.address != node.address]
        if not others or not ids:
            return set()
        queued: set[str] = set()
        for answer in await asyncio.gather(*(self.pool.on(n, show_pipeline(self.pool, n, ids))
                                             for n in others)):
            if answer.value is None:
                self._problem(f"{answer.node.address}: {answer.problem}")
                continue
            for job_id, reply in zip(ids, answer.value.replies, strict=False):
                fields = pairs(reply)
                if fields is not None and text(fields.get("state")) == "queued":
                    queued.add(job_id)
        return queued

    async def _each_id(self, batch: list[tuple[str, dict[str, Any] | None]],
                       nodes: list[Node], command: str) -> None:
        """``command id`` for each job on each of ``nodes``: done where any node did it."""
        ids = [job_id for job_id, _ in batch]
        answers = await self.pool.each(_pipeline([[command, i] for i in ids]), nodes)
        done = [False] * len(ids)
        answered = [False] * len(ids)
        for answer in answers:
            if answer.value is None:
                self._problem(f"{answer.node.address}: {answer.problem}")
                continue
            replies = answer.value.replies
            if answer.value.error is not None:
                self._problem(f"{answer.node.address}: {answer.value.error}")
            for i, reply in enumerate(replies):
                if isinstance(reply, DisqueError):
                    self._problem(f"{answer.node.address}: {reply}")
                    continue
                answered[i] = True
                if isinstance(reply, int) and reply > 0:
                    done[i] = True
        for did, heard in zip(done, answered, strict=True):
            if did:
                self.counts.done += 1
            elif heard:
                self.counts.skipped += 1
            else:
                self.counts.failed += 1

    # --------------------------------------------------------------- moves

    def _add_node(self, old_id: str, source: Node) -> Node:
        """The node the move's ADDJOB goes to: the old job's creator when it
        is in the cluster, reachable and has IDMP; else the first such node
        by ID (deterministic, so a rerun picks the same one)."""
        creator = old_id[2:10]
        usable = [n for n in self._nodes if n.address not in self._no_idmp]
        for node in usable:
            if node.id and node.id.startswith(creator) and node.priority < 100:
                return node
        if source.address not in self._no_idmp:
            return source
        ordered = sorted(usable, key=lambda n: (n.priority >= 100, n.id or "", n.address))
        return ordered[0] if ordered else source

    def _node(self, address: str) -> Node:
        for node in self._nodes:
            if node.address == address:
                return node
        return Node(address)

    def _addjob(self, target: str, fields: dict[str, Any], old_id: str
                ) -> list[str | bytes | int] | None:
        """The ADDJOB that re-creates job ``fields`` in ``target``; None when
        the job expires before it could be added (no TTL left)."""
        body = fields.get("body")
        if not isinstance(body, bytes):
            body = text(body).encode("utf-8", "surrogateescape")
        ttl = number(fields.get("ttl"))
        if ttl <= 0:
            return None
        retry = number(fields.get("retry"))
        command: list[str | bytes | int] = ["ADDJOB", target, body, ADD_TIMEOUT_MS,
                                            "TTL", ttl, "RETRY", retry]
        if retry == 0:
            command += ["REPLICATE", 1]  # at-most-once: one copy, as ADDJOB demands
        max_deliveries = number(fields.get("max-deliveries"))
        if max_deliveries > 0:
            command += ["MAXDELIVERIES", max_deliveries]
            backoff = number(fields.get("backoff"))
            if backoff > 0:
                command += ["BACKOFF", backoff]
            dead = text(fields.get("dead-letter-queue"))
            # The job's dead-letter queue stays where it was, unless that is
            # the default of the queue it leaves (the target's default then
            # applies) or one the target cannot have.
            default_of_source = self.spec.kind == "move" and dead == self.spec.queue + DEAD_SUFFIX
            if dead and not default_of_source and dead not in (target, target + DEAD_SUFFIX):
                command += ["DEADLETTER", dead]
        priority = number(fields.get("priority"))
        if priority > 0:
            command += ["PRIORITY", priority]
        command += _header_args(fields.get("headers"))
        group = fields.get("group")
        if isinstance(group, bytes | str) and group:
            # It joins its group in the target queue, after the jobs there.
            command += ["GROUP", group]
        command += ["IDMP", idmp_key(old_id), "IDMP-WINDOW", IDMP_WINDOW]
        return command

    async def _move(self, node: Node, batch: list[tuple[str, dict[str, Any] | None]]) -> None:
        """Claim (DEQUEUE, WORKING), journal, add (IDMP), acknowledge: see the docstring above."""
        wanted: list[tuple[str, dict[str, Any], str, list[str | bytes | int]]] = []
        for job_id, fields in batch:
            assert fields is not None
            target = self.spec.target_of(fields)
            if target is None or target == self.spec.queue:
                self.counts.skipped += 1
                self._problem(f"job {job_id} has no dead-letter origin: give a target queue")
                continue
            command = self._addjob(target, fields, job_id)
            if command is None:
                self.counts.skipped += 1  # no TTL left: it expires where it is
                continue
            wanted.append((job_id, fields, target, command))
        if not wanted:
            return
        outcome = await self._claim(node, [w[0] for w in wanted])
        if outcome is None:
            self.counts.failed += len(wanted)
            return
        claims: list[Claim] = []
        late = 0
        for job_id, fields, target, command in wanted:
            got = outcome.get(job_id)
            if got is None:
                self.counts.skipped += 1  # taken by a consumer, or moved already
                continue
            status, sent, seconds = got
            if status == "unanswered":
                # No answer: maybe claimed.  Then it is queued again by itself.
                self.counts.failed += 1
                continue
            retry = number(fields.get("retry"))
            if status == "late" and retry > 0:
                late += 1
                continue
            previous = self.in_flight.get(job_id)
            add_on = previous.add_on if previous else self._add_node(job_id, node).address
            claim = Claim(job_id, node.address, add_on, target, command,
                          previous.new if previous else None, retry=retry)
            if retry == 0 or status == "held":
                claim.hold(sent, 0 if retry == 0 else seconds)
            claims.append(claim)
        if late:
            self._left_too_late(late)
        if not claims:
            return
        for address in {c.add_on for c in claims}:
            persists, run_id = await self._facts_of(address)
            for claim in claims:
                if claim.add_on == address:
                    claim.persists, claim.run_id = persists, run_id
        self.journal.append([c.record() for c in claims], sync=True)
        for claim in claims:
            self.in_flight[claim.old] = claim
        self._claims_changed.set()
        await self._finish(claims)

    async def _claim(self, node: Node, ids: list[str]
                     ) -> dict[str, tuple[str, float, int]] | None:
        """Step 1 for ``ids`` on ``node``: DEQUEUE each, then WORKING each one
        it took, which pushes the job's next requeue a RETRY away on every
        copy (DEQUEUE alone leaves it where it was: anywhere up to RETRY).

        Returns, for each job claimed: ``("held", sent, seconds)`` (WORKING
        answered ``seconds``, sent at ``sent``), ``("late", ...)`` (WORKING
        refused: past half its TTL), ``("unknown", ...)`` (no answer to
        WORKING: not known to be held) or ``("unanswered", ...)`` (no answer
        to DEQUEUE).  A job not in the result was not queued there.  None:
        the node did not answer at all (a problem is noted).
        """
        answer = await self.pool.on(node, _pipeline([["DEQUEUE", i] for i in ids]))
        if answer.value is None:
            self._problem(f"{node.address}: {answer.problem} (its jobs were left alone)")
            return None
        if answer.value.error is not None:
            self._problem(f"{node.address}: {answer.value.error}")
        replies = answer.value.replies
        result: dict[str, tuple[str, float, int]] = {}
        taken = []
        for i, job_id in enumerate(ids):
            reply = replies[i] if i < len(replies) else None
            if reply == 1:
                taken.append(job_id)
            elif reply is None or isinstance(reply, DisqueError):
                result[job_id] = ("unanswered", 0.0, 0)
        if not taken:
            return result
        sent = time.monotonic()
        held = await self.pool.on(node, _pipeline([["WORKING", i] for i in taken]))
        replies = held.value.replies if held.value is not None else []
        for i, job_id in enumerate(taken):
            reply = replies[i] if i < len(replies) else None
            if isinstance(reply, int) and not isinstance(reply, bool):
                result[job_id] = ("held", sent, reply)
            elif _too_late(reply):
                result[job_id] = ("late", sent, 0)
            else:
                result[job_id] = ("unknown", sent, 0)
        if held.problem is not None:
            self._problem(f"{node.address}: {held.problem} (claims checked later)")
        return result

    def _left_too_late(self, count: int) -> None:
        self.counts.failed += count
        self._problem(f"{count} jobs are past half their TTL: the nodes refuse WORKING for "
                      "them, so a move cannot keep them from a consumer meanwhile; they were "
                      f"left to come back to {self.spec.queue} by themselves (within their "
                      "RETRY)")

    async def _facts_of(self, address: str) -> tuple[bool | None, str | None]:
        """Whether ``address`` has AOF on, and its run ID (None: unknown),
        asked at most once a minute."""
        cached = self._facts.get(address)
        if cached is not None and time.monotonic() - cached[2] < 60:
            return cached[0], cached[1]
        answer = await self.pool.on(self._node(address), lambda c: c.info())
        if not isinstance(answer.value, dict):
            return None, None
        persistence = answer.value.get("persistence") or {}
        server = answer.value.get("server") or {}
        aof = persistence.get("aof_enabled")
        facts = (bool(number(aof)) if aof is not None else None,
                 text(server.get("run_id")) or None)
        self._facts[address] = (*facts, time.monotonic())
        return facts

    async def _finish(self, claims: list[Claim]) -> None:
        """Steps 3 and 4 for ``claims``; those that cannot finish now stay in
        flight (held), and are tried again at the next batch.

        An ADDJOB is sent only for a claim held long enough, with a timeout
        that ends before its hold does (less ACK_MARGIN): whatever its
        answer, the ACKJOB that follows a success comes while no copy of the
        old job can have been queued again.
        """
        pending = [c for c in claims if c.new is None and c.command is not None and not c.late]
        if any(not c.verified for c in pending):
            await self._verify([c for c in pending if not c.verified])
            pending = [c for c in pending if c.verified and c.old in self.in_flight]
        enough = ACK_MARGIN + MIN_ADD_MS / 1000
        now = time.monotonic()
        short = [c for c in pending if c.held(now) and not c.held(now, enough)]
        if short:
            await self._renew(short)
            now = time.monotonic()
        to_add = [c for c in pending if c.held(now, enough) and c.old in self.in_flight]
        by_node: dict[str, list[Claim]] = {}
        for claim in to_add:
            by_node.setdefault(claim.add_on, []).append(claim)
        added: list[dict[str, Any]] = []
        put_back: list[Claim] = []
        for address, group in by_node.items():
            now = time.monotonic()
            commands: list[list[str | bytes | int]] = []
            longest = 0
            for claim in group:
                assert claim.command is not None
                ms = ADD_TIMEOUT_MS if claim.held_until == float("inf") else int(
                    min(ADD_TIMEOUT_MS, (claim.held_until - now - ACK_MARGIN) * 1000))
                command = list(claim.command)
                command[3] = max(1, ms)
                commands.append(command)
                longest = max(longest, ms)
            answer = await self.pool.on(self._node(address),
                                        _pipeline(commands, wait=longest / 1000 + 2.0))
            if answer.value is None:
                self._problem(f"{address}: {answer.problem} (moves retried)")
                continue
            for claim, reply in zip(group, answer.value.replies, strict=False):
                if isinstance(reply, bytes | str) and not isinstance(reply, DisqueError):
                    claim.new = text(reply)
                    added.append({"r": "added", "old": claim.old, "new": claim.new})
                elif isinstance(reply, IdmpBusy) or (isinstance(reply, NoRepl)
                                                     and "timeout" in str(reply).lower()):
                    # The first ADDJOB still replicates, or its copies did not
                    # answer in time (nothing added): asked again at the next
                    # batch, the claim held meanwhile.  (Too few nodes to
                    # copy it to is a refusal: put back, below.)
                    continue
                elif _is_syntax_error(reply):
                    # An original node: no IDMP.  Another node takes this job's
                    # ADDJOB from now on (journaled before it is sent).
                    self._no_idmp.add(address)
                    claim.add_on = self._add_node(claim.old, self._node(claim.source)).address
                    claim.persists, claim.run_id = await self._facts_of(claim.add_on)
                    self.journal.append([claim.record()], sync=True)
                else:
                    self._problem(f"adding {claim.old} to {claim.target} on {address}: "
                                  f"{reply}")
                    put_back.append(claim)
            if answer.value.error is not None:
                self._problem(f"{address}: {answer.value.error} (moves retried)")
        # On disk before the ACK: a resume must know the job was added.
        self.journal.append(added, sync=True)
        if put_back:
            await self._put_back(put_back)
        await self._acknowledge([c for c in claims if c.new is not None
                                 and c.old in self.in_flight])

    async def _put_back(self, claims: list[Claim]) -> None:
        """The jobs could not be added: queue them again where they were
        (those still held: a claim whose hold lapsed may be a consumer's by
        now, and comes back by itself anyway)."""
        now = time.monotonic()
        # RETRY 0: nothing would ever queue it again (ENQUEUE refuses it):
        # kept, and its ADDJOB tried again.
        kept = [c for c in claims if c.retry == 0]
        if kept:
            self._problem(f"{len(kept)} at-most-once jobs (RETRY 0) could not be added; they "
                          "cannot be put back (nothing queues them again): kept and tried "
                          "again; resume the task if it ends first")
        held = [c for c in claims if c.retry != 0 and c.held(now)]
        gone = [c for c in claims if c.retry != 0]
        by_source: dict[str, list[Claim]] = {}
        for claim in held:
            by_source.setdefault(claim.source, []).append(claim)
        for address, group in by_source.items():
            ids = [c.old for c in group]
            answer = await self.pool.on(self._node(address),
                                        lambda c, i=ids: c.enqueue(*i))  # type: ignore[misc]
            if answer.problem is not None:
                self._problem(f"{address}: {answer.problem} (the jobs come back after RETRY)")
        self.journal.append([{"r": "back", "old": c.old} for c in gone])
        for claim in gone:
            self.in_flight.pop(claim.old, None)
        self.counts.failed += len(gone)

    async def _acknowledge(self, claims: list[Claim]) -> None:
        """ACKJOB the old jobs of added moves (the node they were claimed on,
        else the node that added them: an ACK spreads to every copy)."""
        by_source: dict[str, list[Claim]] = {}
        for claim in claims:
            by_source.setdefault(claim.source, []).append(claim)
        for address, group in by_source.items():
            ids = [c.old for c in group]
            answer = await self.pool.on(self._node(address),
                                        lambda c, i=ids: c.ack(*i))  # type: ignore[misc]
            if answer.problem is not None and group[0].add_on != address:
                answer = await self.pool.on(self._node(group[0].add_on),
                                            lambda c, i=ids: c.ack(*i))  # type: ignore[misc]
            if answer.problem is not None:
                self._problem(f"{address}: {answer.problem} (acknowledgements retried)")
                continue
            self.journal.append([{"r": "done", "old": c.old, "new": c.new} for c in group],
                                sync=True)
            for claim in group:
                self.in_flight.pop(claim.old, None)
            self.counts.done += len(group)

    # -------------------------------------------------------- claims held

    async def _keep(self) -> None:
        """Renew the holds of the claims in flight as they come due, on
        connections of its own, whatever the task is waiting for meanwhile
        (an ADDJOB that waits for its copies, a slow node's JSCAN or SHOW)."""
        while True:
            due = self._next_renewal() - time.monotonic()
            self._claims_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._claims_changed.wait(),
                                       None if due == float("inf") else max(0.0, due))
            await self._renew_due()

    def _next_renewal(self) -> float:
        """When the first hold of the claims in flight is due for renewal."""
        now = time.monotonic()
        return min((c.renew_at for c in self.in_flight.values()
                    if c.held(now) and c.held_until != float("inf")), default=float("inf"))

    async def _renew_due(self) -> None:
        now = time.monotonic()
        due = [c for c in self.in_flight.values() if c.held(now)
               and c.held_until != float("inf") and c.renew_at <= now]
        if due:
            await self._renew(due)

    async def _renew(self, claims: list[Claim]) -> None:
        """WORKING again for claims still held: a hold that lapsed is never
        renewed (the job may have been queued again and delivered since:
        only a state check tells).  A claim past half its TTL (TOOLATE) is
        marked ``late``: :meth:`_tend` lets it go."""
        now = time.monotonic()
        by_source: dict[str, list[Claim]] = {}
        for claim in claims:
            if claim.held(now) and claim.held_until != float("inf") and not claim.late:
                by_source.setdefault(claim.source, []).append(claim)
        for address, group in by_source.items():
            sent = time.monotonic()
            answer = await self._holder.on(self._node(address),
                                           _pipeline([["WORKING", c.old] for c in group]))
            replies = answer.value.replies if answer.value is not None else []
            for i, claim in enumerate(group):
                reply = replies[i] if i < len(replies) else None
                if isinstance(reply, int) and not isinstance(reply, bool):
                    claim.hold(sent, reply)
                elif _too_late(reply):
                    claim.late = True
                else:
                    # Not renewed: tried again shortly while the hold lasts,
                    # then checked.
                    claim.renew_at = time.monotonic() + 0.1
            if answer.problem is not None:
                self._problem(f"{address}: {answer.problem} (claims not renewed)")

    async def _let_late_go(self) -> None:
        """Claims past half their TTL, which WORKING no longer holds."""
        late = [c for c in self.in_flight.values() if c.late]
        added = [c for c in late if c.new is not None]
        if added:
            await self._acknowledge(added)  # added already: the old one goes now
        dropped = [c for c in late if c.new is None]
        if dropped:
            # Still held for a while, then queued again by its node: let it.
            self.journal.append([{"r": "back", "old": c.old} for c in dropped])
            for claim in dropped:
                self.in_flight.pop(claim.old, None)
                self._too_late.add(claim.old)
            self._left_too_late(len(dropped))

    async def _tend(self) -> None:
        """The moves in flight: renew their holds, check those not held
        (SHOW), then add and acknowledge what can be."""
        await self._let_late_go()
        now = time.monotonic()
        for claim in list(self.in_flight.values()):
            if not claim.held(now) and now - claim.checked_at >= CHECK_SPACING:
                claim.checked_at = now
                await self._rebuild(claim)
        now = time.monotonic()
        ready = [c for c in self.in_flight.values()
                 if c.new is not None or (c.command is not None and c.held(now))]
        if ready:
            await self._finish(ready)

    async def _settle(self, seconds: float) -> None:
        """Retry the moves that could not finish, for up to ``seconds``."""
        # A cancelled task does not keep its user waiting long: what is left
        # is journaled, and its jobs come back after their RETRY anyway.
        deadline = time.monotonic() + (min(seconds, 5.0) if self._cancelled else seconds)
        while self.in_flight and time.monotonic() < deadline:
            await self._tend()
            if self.in_flight:
                await asyncio.sleep(0.25)
        if self.in_flight:
            self._problem(f"{len(self.in_flight)} moves did not finish: resume the task "
                          "(their jobs are queued again after their RETRY meanwhile)")

    async def _settle_resumed(self) -> None:
        """The journal's claims first: each one checked (where its old job
        is now, and whether its ADDJOB's IDMP key can still be trusted),
        then its ADDJOB again (IDMP makes a repeat add nothing), then its
        acknowledgement."""
        for claim in self.in_flight.values():
            claim.verified = False
            claim.held_until = claim.renew_at = 0.0  # checked before anything
        await self._verify(list(self.in_flight.values()))
        await self._tend()

    async def _verify(self, claims: list[Claim]) -> None:
        """Whether a resumed claim's ADDJOB may be sent again: its IDMP key
        still exists unless the claim is older than the key's window or its
        node restarted without AOF.  Such a move, not known to be added, is
        neither added again nor acknowledged: it is left to the operator,
        whom the task's status tells what to check."""
        for claim in claims:
            why = ""
            if claim.claimed_at and time.time() - claim.claimed_at > IDMP_WINDOW - IDMP_MARGIN:
                why = (f"claimed {(time.time() - claim.claimed_at) / 3600:.0f} h ago: the IDMP "
                       f"key of its ADDJOB (a {IDMP_WINDOW // 3600} h window) may be gone")
            elif claim.run_id is not None and claim.persists is False:
                persists, run_id = await self._facts_of(claim.add_on)
                if run_id is None:
                    continue  # not reachable now: checked again before its ADDJOB
                if run_id != claim.run_id and not persists:
                    why = (f"{claim.add_on} restarted since, without AOF: it forgot the IDMP "
                           "key of its ADDJOB")
            claim.verified = True
            if not why or claim.new is not None:
                continue  # added (the journal says so): only its ACK is left
            entry = {"old": claim.old, "target": claim.target, "add_on": claim.add_on,
                     "why": why}
            self.unverified.append(entry)
            self.journal.append([{"r": "unverified", **entry}], sync=True)
            self.in_flight.pop(claim.old, None)
            self.counts.failed += 1
            self._problem(
                f"move of {claim.old} to {claim.target} not verified ({why}): it was neither "
                f"added again nor acknowledged. Check whether {claim.target} holds a job "
                f"with its body: if so the move happened, acknowledge {claim.old}; if not, "
                f"{claim.old} comes back to {self.spec.queue} by itself after its RETRY "
                "(ENQUEUE it if its RETRY is 0)")

    async def _rebuild(self, claim: Claim) -> None:
        """A claim not held: where its old job is now (SHOW on every node),
        and its ADDJOB from SHOW."""
        # With the body: the ADDJOB of the move is built from these fields.
        answers = await asyncio.gather(*(self.pool.on(n, show_one(self.pool, n, claim.old,
                                                                  body=True))
                                         for n in self._nodes))
        copies = [(a.node, pairs(a.value)) for a in answers if a.value is not None]
        copies = [(n, f) for n, f in copies if f is not None]
        if not copies:
            if any(a.problem is not None for a in answers):
                return  # a node did not answer: it may hold the job; later
            # Gone: moved and acknowledged before the journal said so, or
            # expired, or acknowledged by somebody else.
            self.journal.append([{"r": "done" if claim.new else "back", "old": claim.old}])
            self.in_flight.pop(claim.old, None)
            if claim.new:
                self.counts.done += 1
            else:
                self.counts.skipped += 1
            return
        fields = copies[0][1]
        assert fields is not None
        if claim.retry is None:
            claim.retry = number(fields.get("retry"))
        queued = [n for n, f in copies if f is not None and text(f.get("state")) == "queued"]
        if queued:
            # Queued again (its hold lapsed): claimed again, as a new claim would be.
            outcome = await self._claim(queued[0], [claim.old])
            status, sent, seconds = (outcome or {}).get(claim.old, ("", 0.0, 0))
            if status in ("", "unanswered"):
                return  # a consumer took it meanwhile, or the node is away: later
            claim.source = queued[0].address
            if status == "held" or claim.retry == 0:
                claim.hold(sent, 0 if claim.retry == 0 else seconds)
                self._claims_changed.set()
            elif status == "late":
                if claim.new is None:
                    self.journal.append([{"r": "back", "old": claim.old}])
                    self.in_flight.pop(claim.old, None)
                    self._too_late.add(claim.old)
                    self._left_too_late(1)
                    return
            else:
                return  # claimed but not known to be held: checked again later
        elif claim.new is None and claim.retry > 0:
            # Active and not known to be added: our claim, or (its hold
            # lapsed) a consumer's delivery.  Only a job queued again is
            # certainly not a consumer's: wait for that.
            return
        elif claim.retry == 0:
            # At most once: never queued again, so once our DEQUEUE took it,
            # nobody else can; waiting would keep it out of every queue
            # until its TTL ends.
            claim.hold(0.0, 0)
        command = self._addjob(claim.target, fields, claim.old)
        if command is None and claim.new is None:
            self.journal.append([{"r": "back", "old": claim.old}])
            self.in_flight.pop(claim.old, None)
            self.counts.skipped += 1
            return
        claim.command = command


# --------------------------------------------------------------------------
# The console's tasks
# --------------------------------------------------------------------------

def new_task_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class TaskManager:
    """The console's tasks: started, listed, controlled, journaled in ``directory``.

    A task runs as the user who started it (its own connections, so a long
    pipeline never holds a page's).  Tasks found in the directory at start
    are shown as interrupted; their user may resume them (the console keeps
    no password, so it cannot resume them by itself).
    """

    #: Tasks running at once; more wait for their turn.
    RUNNING = 4
    #: Tasks of one user running at once: one user's queue of tasks leaves
    #: the other slots to the others.
    PER_USER = 2
    #: Finished tasks kept in memory (the newest).
    KEPT = 50

    def __init__(self, settings: Settings, directory: Path | None) -> None:
        self.settings = settings
        self.directory = directory
        self.tasks: dict[str, Task] = {}
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(self.RUNNING)
        self._user_slots: dict[str, asyncio.Semaphore] = {}
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            for path in sorted(directory.glob("*.jsonl"))[-self.KEPT:]:
                self._restore(path)

    def _restore(self, path: Path) -> None:
        try:
            resumed = replay(Journal.read(path))
        except OSError as exc:
            log.warning("cannot read task journal %s: %s", path, exc)
            return
        if resumed is None or not resumed.task_id:
            return
        pool = Pool(tuple(self.settings.nodes), Credentials(), self.settings)
        task = Task(resumed.task_id, resumed.spec, resumed.user, pool, Journal(path),
                    resumed.created, resumed)
        task.state = resumed.state
        self.tasks[task.id] = task

    def start(self, spec: TaskSpec, credentials: Credentials) -> Task:
        task_id = new_task_id()
        path = self.directory / f"{task_id}.jsonl" if self.directory else None
        pool = Pool(tuple(self.settings.nodes), credentials, self.settings)
        task = Task(task_id, spec, credentials.user, pool, Journal(path))
        self.tasks[task.id] = task
        self._launch(task)
        self._forget_old()
        return task

    def resume(self, task: Task, credentials: Credentials) -> Task:
        """Run a task that stopped (interrupted, cancelled, failed) again, as
        ``credentials`` (its user): its unfinished moves first, then a new
        walk of the queue, its counters going on."""
        resumed = Resumed(task.id, task.spec, task.user, task.created, task.counts,
                          "interrupted", dict(task.in_flight), {}, list(task.unverified))
        pool = Pool(tuple(self.settings.nodes), credentials, self.settings)
        again = Task(task.id, task.spec, credentials.user, pool, task.journal, task.created,
                     resumed)
        self.tasks[task.id] = again
        self._launch(again)
        return again

    def _launch(self, task: Task) -> None:
        mine = self._user_slots.setdefault(task.user, asyncio.Semaphore(self.PER_USER))

        async def run() -> None:
            # The user's own slot first: a user's waiting tasks hold none of
            # the shared ones.
            async with mine, self._slots:
                if task._cancelled:
                    task.state = "cancelled"
                    return
                await task.run()

        self._runners[task.id] = asyncio.get_running_loop().create_task(run())

    def _forget_old(self) -> None:
        done = [t for t in self.tasks.values() if not t.active and t.state != "interrupted"]
        for task in sorted(done, key=lambda t: t.created)[:-self.KEPT]:
            self.tasks.pop(task.id, None)
            self._runners.pop(task.id, None)

    def visible(self, user: str, queue: str | None = None) -> list[Task]:
        """The tasks ``user`` started (on ``queue``, or its dead letters), newest first."""
        tasks = [t for t in self.tasks.values() if t.user == user
                 and (queue is None or t.spec.queue == queue or t.spec.to == queue)]
        return sorted(tasks, key=lambda t: t.created, reverse=True)

    def get(self, task_id: str, user: str) -> Task | None:
        task = self.tasks.get(task_id)
        return task if task is not None and task.user == user else None

    async def close(self) -> None:
        """Stop every task where it is: journaled as interrupted, resumable."""
        for runner in self._runners.values():
            runner.cancel()
        for runner in self._runners.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await runner
        for task in self.tasks.values():
            with contextlib.suppress(Exception):
                await task.pool.close()


def _header_args(headers: Any) -> list[str | bytes | int]:
    """``HEADER name value`` for each of a job's headers (SHOW's flat
    ``headers`` array), so that a moved job keeps its trace context and tags."""
    if not isinstance(headers, list) or len(headers) % 2:
        return []
    args: list[str | bytes | int] = []
    for name, value in zip(headers[::2], headers[1::2], strict=True):
        if isinstance(name, bytes) and isinstance(value, bytes):
            args += ["HEADER", name, value]
    return args
