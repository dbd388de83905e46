"""Every queue of the cluster, merged across nodes, filtered, sorted and paged in memory.

Why a table in memory: a page of 50 queues out of 10,000 must not cost
10,000 QSTATs per request (RabbitMQ's management UI lists 6,000 queues in
8-9 s by asking for all of them each time).  The table is rebuilt in the
background (QSCAN, then pipelined QSTATs, 250 per round trip) while
requests read the last complete one: filtering, sorting and paging 10,000
rows takes milliseconds.  A rebuild starts when a page asks for a table older
than a couple of seconds and none is running, and never sooner than twenty
times the last rebuild's duration after it: the rebuild (the nodes' answers
and the console's parsing) takes at most a twentieth of the time, however
many queues they hold.  The sorted orders of a table are kept with it: a
page sorts 10,000 rows once per table and sort, not once per request.

The table is built with the user's own commands, so it lists exactly the
queues the user's QSCAN returns (a user limited to ``~team-a:*`` sees
those), and rates come from two successive tables' jobs-in / jobs-out.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from disque.client import AsyncClient

from .nodes import Answer, Node, Pool, Problem
from .replies import encode, number, pairs, text
from .shows import show_pipeline

__all__ = ["QueueStat", "QueueRow", "Snapshot", "QueueFilter", "FilterError", "QueueIndex",
           "SORT_COLUMNS", "peeker", "shower"]

#: QSTATs per round trip.  A node runs the commands of a pipeline it has
#: read in one turn, so this bounds how long a rebuild holds it at a time
#: (~2 ms of an interpreted node; a thousand held it ~9 ms, and a consumer's
#: GETJOB that came meanwhile waited that long).
BATCH = 250
#: A rebuild starts no sooner than this many times the last one's duration
#: (the nodes' share), nor this many times the CPU time the console spent
#: meanwhile (its own share, on cores it may share with a node).
REBUILD_SPACING = 20
REBUILD_CPU_SPACING = 50


#: Pause states as the nodes spell them, decoded once.
_PAUSES: dict[Any, str] = {b"none": "none", b"in": "in", b"out": "out", b"all": "all"}
_NO_PRIORITIES: tuple[tuple[int, int], ...] = ()


def _int(value: Any) -> int:
    if type(value) is int:
        return value
    return 0 if value is None else number(value)


class QueueStat(NamedTuple):
    """One node's QSTAT of one queue.

    A named tuple, parsed straight from the reply's bytes keys: the queue
    table parses one per queue and node at each rebuild (10,000 and more),
    where a frozen dataclass built from a dict of decoded keys cost three
    times as much (``benchmarks/console.py``, docs/BENCHMARKS.md).
    """

    length: int
    age: int
    idle: int
    blocked: int
    jobs_in: int
    jobs_out: int
    pause: str
    limit: tuple[int, int] | None
    priorities: tuple[tuple[int, int], ...]
    dead_lettered: int
    rate_limited: int

    @classmethod
    def from_reply(cls, reply: Any) -> QueueStat | None:
        """From QSTAT's flat key/value reply; None for anything else (a
        queue that went away answers nil; an odd reply never raises)."""
        if not isinstance(reply, list) or len(reply) % 2:
            return None
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        if fields and type(next(iter(fields))) is not bytes:
            fields = {text(k).encode(): v for k, v in fields.items()}
        get = fields.get
        limit = get(b"rate-limit")
        prios = get(b"priorities")
        pause = get(b"pause")
        return cls(
            _int(get(b"len")), _int(get(b"age")), _int(get(b"idle")), _int(get(b"blocked")),
            _int(get(b"jobs-in")), _int(get(b"jobs-out")),
            _PAUSES.get(pause) or text(pause) or "none",
            ((_int(limit[0]), _int(limit[1]))
             if isinstance(limit, list) and len(limit) == 2 else None),
            tuple((_int(p), _int(c)) for p, c in zip(prios[::2], prios[1::2], strict=False))
            if isinstance(prios, list) and prios else _NO_PRIORITIES,
            _int(get(b"dead-lettered")), _int(get(b"rate-limited")))


@dataclass
class QueueRow:
    """One queue, merged over the nodes that have it."""

    name: str
    per_node: dict[str, QueueStat] = field(default_factory=dict)
    rate_in: float = 0.0
    rate_out: float = 0.0

    @property
    def length(self) -> int:
        return sum(s.length for s in self.per_node.values())

    @property
    def blocked(self) -> int:
        return sum(s.blocked for s in self.per_node.values())

    @property
    def age(self) -> int:
        return max((s.age for s in self.per_node.values()), default=0)

    @property
    def idle(self) -> int:
        return min((s.idle for s in self.per_node.values()), default=0)

    @property
    def jobs_in(self) -> int:
        return sum(s.jobs_in for s in self.per_node.values())

    @property
    def jobs_out(self) -> int:
        return sum(s.jobs_out for s in self.per_node.values())

    @property
    def dead_lettered(self) -> int:
        return sum(s.dead_lettered for s in self.per_node.values())

    @property
    def pause(self) -> str:
        """The pause state, or ``mixed`` when the nodes differ."""
        states = {s.pause for s in self.per_node.values()}
        return states.pop() if len(states) == 1 else ("mixed" if states else "none")

    @property
    def paused(self) -> bool:
        return any(s.pause != "none" for s in self.per_node.values())

    @property
    def limit(self) -> tuple[int, int] | None:
        return next((s.limit for s in self.per_node.values() if s.limit), None)

    @property
    def priorities(self) -> dict[int, int]:
        merged: dict[int, int] = {}
        for stat in self.per_node.values():
            for prio, count in stat.priorities:
                merged[prio] = merged.get(prio, 0) + count
        return dict(sorted(merged.items(), reverse=True))

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "length": self.length, "blocked": self.blocked,
            "age": self.age, "idle": self.idle, "jobs_in": self.jobs_in,
            "jobs_out": self.jobs_out, "rate_in": round(self.rate_in, 2),
            "rate_out": round(self.rate_out, 2), "pause": self.pause,
            "limit": list(self.limit) if self.limit else None,
            "priorities": {str(p): c for p, c in self.priorities.items()},
            "dead_lettered": self.dead_lettered,
            "per_node": {a: {"length": s.length, "blocked": s.blocked, "pause": s.pause,
                             "jobs_in": s.jobs_in, "jobs_out": s.jobs_out}
                         for a, s in self.per_node.items()},
        }


#: Sortable columns and how each sorts.
SORT_COLUMNS: dict[str, Any] = {
    "name": lambda r: r.name, "length": lambda r: r.length, "blocked": lambda r: r.blocked,
    "age": lambda r: r.age, "idle": lambda r: r.idle, "rate_in": lambda r: r.rate_in,
    "rate_out": lambda r: r.rate_out, "pause": lambda r: r.pause,
    "limit": lambda r: (r.limit or (0, 0))[0], "dead_lettered": lambda r: r.dead_lettered,
}


class FilterError(ValueError):
    """A filter or paging parameter that does not parse; the message says which."""


@dataclass(frozen=True)
class QueueFilter:
    """What /queues shows: a name pattern, thresholds, an order and a page."""

    pattern: str = ""
    min_length: int = 0
    paused: str = "any"      # any | yes | no
    limited: str = "any"     # any | yes | no
    sort: str = "length"
    descending: bool = True
    page: int = 1
    per_page: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> QueueFilter:
        """From a query string; :class:`FilterError` names what is wrong."""
        def whole(name: str, default: int, low: int, high: int) -> int:
            raw = params.get(name, "").strip()
            if not raw:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise FilterError(f"{name} must be a whole number, not {raw[:40]!r}") from None
            if not low <= value <= high:
                raise FilterError(f"{name} must be between {low} and {high}")
            return value

        pattern = params.get("pattern", "")
        if len(pattern) > 1024:
            raise FilterError("pattern is longer than 1024 characters")
        choice = {}
        for name in ("paused", "limited"):
            choice[name] = params.get(name, "") or "any"
            if choice[name] not in ("any", "yes", "no"):
                raise FilterError(f"{name} must be any, yes or no")
        sort = params.get("sort", "") or "length"
        if sort not in SORT_COLUMNS:
            raise FilterError(f"cannot sort on {sort[:40]!r}: use one of "
                              + ", ".join(SORT_COLUMNS))
        order = params.get("order", "") or ("asc" if sort == "name" else "desc")
        if order not in ("asc", "desc"):
            raise FilterError("order must be asc or desc")
        return cls(pattern=pattern, min_length=whole("min_length", 0, 0, 2**63),
                   paused=choice["paused"], limited=choice["limited"], sort=sort,
                   descending=order == "desc", page=whole("page", 1, 1, 10**9),
                   per_page=whole("per_page", 50, 1, 500))

    def matches(self, row: QueueRow) -> bool:
        if self.pattern and not fnmatch.fnmatchcase(row.name, self.pattern):
            return False
        if self.min_length and row.length < self.min_length:
            return False
        if self.paused != "any" and row.paused != (self.paused == "yes"):
            return False
        return self.limited == "any" or (row.limit is not None) == (self.limited == "yes")

    def query(self, **changes: Any) -> dict[str, str]:
        """Query-string values of this filter with ``changes`` (for links)."""
        values = {"pattern": self.pattern, "min_length": str(self.min_length or ""),
                  "paused": self.paused, "limited": self.limited, "sort": self.sort,
                  "order": "desc" if self.descending else "asc", "page": str(self.page),
                  "per_page": str(self.per_page)}
        values.update({k: str(v) for k, v in changes.items()})
        return {k: v for k, v in values.items() if v and v != "any"}


@dataclass
class Snapshot:
    """One complete table: every queue, and what each node answered."""

    rows: dict[str, QueueRow]
    problems: dict[str, Problem]
    taken_at: float
    duration: float
    #: (sort column, descending) -> every row in that order.
    _orders: dict[tuple[str, bool], list[QueueRow]] = field(default_factory=dict)

    def ordered(self, sort: str, descending: bool) -> list[QueueRow]:
        """Every row in the order of a sort column, computed once per table."""
        cached = self._orders.get((sort, descending))
        if cached is None:
            cached = sorted(self.rows.values(), key=lambda r: r.name)
            # Ties keep a stable order by name, so paging never shows a queue twice.
            cached.sort(key=SORT_COLUMNS[sort], reverse=descending)
            self._orders[(sort, descending)] = cached
        return cached

    def select(self, flt: QueueFilter) -> tuple[list[QueueRow], int]:
        """The page ``flt`` asks for and how many rows matched in all."""
        rows = self.ordered(flt.sort, flt.descending)
        if flt.pattern or flt.min_length or flt.paused != "any" or flt.limited != "any":
            rows = [r for r in rows if flt.matches(r)]
        start = (flt.page - 1) * flt.per_page
        return rows[start:start + flt.per_page], len(rows)


def _qstats(names: list[str]) -> bytes:
    """``QSTAT name`` for each of ``names``, RESP-encoded back to back."""
    out = []
    for name in names:
        raw = name.encode("utf-8", "surrogateescape")
        out.append(b"*2\r\n$5\r\nQSTAT\r\n$%d\r\n%b\r\n" % (len(raw), raw))
    return b"".join(out)


async def _node_stats(client: AsyncClient) -> dict[str, QueueStat]:
    """QSCAN then pipelined QSTATs on one node."""
    names = [name async for name in client.qscan(count=1000)]
    names = list(dict.fromkeys(names))  # SCAN may repeat a name
    stats: dict[str, QueueStat] = {}
    for start in range(0, len(names), BATCH):
        chunk = names[start:start + BATCH]
        payload = _qstats(chunk)
        count = len(chunk)

        def build(_node: str | None, p: bytes = payload, k: int = count) -> tuple[bytes, int]:
            return p, k

        result = await client.send_pipeline(build)
        if result.error is not None:
            raise result.error
        for name, reply in zip(chunk, result.replies, strict=False):
            stat = QueueStat.from_reply(reply)
            if stat is not None:  # None: the queue went away between QSCAN and QSTAT
                stats[name] = stat
    return stats


def peeker(names: list[str]) -> Any:
    """QPEEK 1 of each of ``names``, pipelined: {name: the next job's ID or None}."""
    async def call(client: AsyncClient) -> dict[str, str | None]:
        payload = encode(("QPEEK", n, 1) for n in names)
        result = await client.send_pipeline(lambda _node: (payload, len(names)))
        if result.error is not None:
            raise result.error
        heads: dict[str, str | None] = {}
        for name, reply in zip(names, result.replies, strict=False):
            job = reply[0] if isinstance(reply, list) and reply else None
            heads[name] = text(job[1]) if isinstance(job, list) and len(job) > 1 else None
        return heads
    return call


def shower(pool: Pool, node: Node, ids: list[str]) -> Any:
    """SHOW of each of ``ids`` on ``node``, pipelined and without the bodies
    where the node can (``SHOW id NOBODY``): {id: (ctime in ns,
    dead-lettered-from)} of those still there."""
    show = show_pipeline(pool, node, ids)

    async def call(client: AsyncClient) -> dict[str, tuple[int, str | None]]:
        result = await show(client)
        if result.error is not None:
            raise result.error
        facts: dict[str, tuple[int, str | None]] = {}
        for job_id, reply in zip(ids, result.replies, strict=False):
            fields = pairs(reply)
            if fields is not None and number(fields.get("ctime")) > 0:
                facts[job_id] = (number(fields.get("ctime")),
                                 text(fields.get("dead-lettered-from")) or None)
        return facts
    return call


class QueueIndex:
    """The queue table of one pool (one user), rebuilt in the background."""

    def __init__(self, pool: Pool, max_age: float = 2.0, watch_points: int = 600) -> None:
        self.pool = pool
        self.max_age = max_age
        self.snapshot: Snapshot | None = None
        self._task: asyncio.Task[Snapshot] | None = None
        self._next_allowed = 0.0
        #: Recent points of the queues a page looked at lately: name ->
        #: (time, length, rate in, rate out); a bounded set of queues.
        self.watched: OrderedDict[str, deque[tuple[float, int, float, float]]] = OrderedDict()
        self.watch_points = watch_points
        #: name -> (monotonic time, jobs in, jobs out) of its last observation.
        self._counters: dict[str, tuple[float, int, int]] = {}
        #: (address, queue) -> (the table it was read for, the ID of the
        #: next job out there): read once per table for the queues shown.
        self._heads: dict[tuple[str, str], tuple[float, str | None]] = {}
        #: job ID -> (ctime in ns, dead-lettered-from), which never change
        #: while the job lives; the newest 20,000 kept.
        self.job_facts: OrderedDict[str, tuple[int, str | None]] = OrderedDict()

    def observe(self, name: str, length: int, jobs_in: int,
                jobs_out: int) -> list[tuple[float, int, float, float]]:
        """Add a point for ``name`` from its QSTATs (summed over the nodes),
        its rates from the previous observation; the points kept so far.

        The queue's page observes it at each of its updates, so its chart
        costs a QSTAT per node, never the whole queue table.
        """
        points = self.watched.pop(name, None) or deque(maxlen=self.watch_points)
        self.watched[name] = points
        while len(self.watched) > 50:
            gone, _ = self.watched.popitem(last=False)
            self._counters.pop(gone, None)
        now = time.monotonic()
        before = self._counters.get(name)
        self._counters[name] = (now, jobs_in, jobs_out)
        if before is not None and now - before[0] >= 0.5:
            elapsed = now - before[0]
            rate_in = max(0, jobs_in - before[1]) / elapsed
            rate_out = max(0, jobs_out - before[2]) / elapsed
            points.append((time.time(), length, round(rate_in, 2), round(rate_out, 2)))
        elif before is None:
            points.append((time.time(), length, 0.0, 0.0))
        else:
            self._counters[name] = before  # too soon after the last one: no new point
        return list(points)

    async def get(self, fresh: bool = False) -> Snapshot:
        """The last table; a new one when asked (``fresh``) or when there is none.

        A new table asked for still comes no sooner than the spacing allows
        (twenty times the last rebuild's duration, at least ``max_age``):
        the request waits for it, and the requests that wait meanwhile share
        it, so asking again and again cannot keep the nodes rebuilding.
        """
        now = time.monotonic()
        if fresh and self._task is None and self.snapshot is not None \
                and now < self._next_allowed:
            await asyncio.sleep(self._next_allowed - now)
            now = time.monotonic()
        if self._task is None and (self.snapshot is None or fresh or (
                now - self.snapshot.taken_at > self.max_age and now >= self._next_allowed)):
            self._task = asyncio.get_running_loop().create_task(self._rebuild())
        if self._task is not None and (self.snapshot is None or fresh):
            task = self._task
            return await asyncio.shield(task)
        assert self.snapshot is not None
        return self.snapshot

    async def next_job_ages(self, snapshot: Snapshot, rows: list[QueueRow]
                            ) -> dict[str, float | None]:
        """The age (seconds) of the next job out of each of ``rows`` (the
        page shown), the oldest of its nodes', None when none is queued.

        Only QPEEK 1 names the next job, and it returns its body; ``SHOW
        id NOBODY`` (plain SHOW on an original node) gives its ctime.  So
        only the queues on the page are asked, once per table (a new table,
        every few seconds at most, asks again), one pipelined QPEEK per
        node for those holding queued jobs, and SHOW only for jobs not seen
        before: a job's ctime never changes.
        """
        wanted: dict[str, list[str]] = {}
        for row in rows:
            for address, stat in row.per_node.items():
                cached = self._heads.get((address, row.name))
                if stat.length > 0 and (cached is None or cached[0] != snapshot.taken_at):
                    wanted.setdefault(address, []).append(row.name)
        if wanted:
            nodes = [n for n in await self.pool.nodes() if n.address in wanted]
            answers = await asyncio.gather(*(self.pool.on(n, peeker(wanted[n.address]))
                                             for n in nodes))
            unknown: dict[str, list[str]] = {}
            for answer in answers:
                if answer.value is None:
                    continue
                for name, job_id in answer.value.items():
                    self._heads[(answer.node.address, name)] = (snapshot.taken_at, job_id)
                    if job_id is not None and job_id not in self.job_facts:
                        unknown.setdefault(answer.node.address, []).append(job_id)
            pool = self.pool
            for answer in await asyncio.gather(*(pool.on(n, shower(pool, n, unknown[n.address]))
                                                 for n in nodes if n.address in unknown)):
                self.learn(answer.value or {})
            while len(self._heads) > 20_000:
                del self._heads[next(iter(self._heads))]
        now = time.time()
        ages: dict[str, float | None] = {}
        for row in rows:
            found = []
            for address, stat in row.per_node.items():
                head = self._heads.get((address, row.name)) if stat.length > 0 else None
                ctime = self.job_facts.get(head[1], (0, None))[0] if head and head[1] else 0
                if ctime:
                    found.append(max(0.0, now - ctime / 1e9))
            ages[row.name] = round(max(found), 1) if found else None
        return ages

    def learn(self, facts: dict[str, tuple[int, str | None]]) -> None:
        """Keep jobs' ctime and origin (from SHOW): asked once per job."""
        for job_id, fact in facts.items():
            self.job_facts[job_id] = fact
            self.job_facts.move_to_end(job_id)
        while len(self.job_facts) > 20_000:
            self.job_facts.popitem(last=False)

    async def _rebuild(self) -> Snapshot:
        try:
            started, cpu = time.monotonic(), time.process_time()
            nodes = await self.pool.nodes()
            answers = await self.pool.each(_node_stats, nodes)
            snapshot = self._merge(answers, started)
            self.snapshot = snapshot
            # A twentieth of the time at most for the nodes, and 2% of a
            # core for the console (its CPU time meanwhile, other requests'
            # included: erring on the side of fewer rebuilds).  With 10,000
            # queues a rebuild takes ~0.2 s and ~0.1 s of the console's CPU
            # here: the table is ~5 s old at worst.
            self._next_allowed = time.monotonic() + max(
                self.max_age, REBUILD_SPACING * snapshot.duration,
                REBUILD_CPU_SPACING * (time.process_time() - cpu))
            return snapshot
        finally:
            self._task = None

    def _merge(self, answers: list[Answer[dict[str, QueueStat]]], started: float) -> Snapshot:
        now = time.monotonic()
        previous = self.snapshot
        rows: dict[str, QueueRow] = {}
        problems: dict[str, Problem] = {}
        for answer in answers:
            if answer.problem is not None or answer.value is None:
                problems[answer.node.address] = answer.problem or Problem("error", "no answer")
                continue
            for name, stat in answer.value.items():
                row = rows.get(name)
                if row is None:
                    row = rows[name] = QueueRow(name)
                row.per_node[answer.node.address] = stat
        if previous is not None:
            elapsed = max(now - previous.taken_at, 1e-3)
            for name, row in rows.items():
                old = previous.rows.get(name)
                if old is None:
                    continue
                rate_in = rate_out = 0.0
                for address, stat in row.per_node.items():
                    before = old.per_node.get(address)
                    if before is None or stat.jobs_in < before.jobs_in:
                        continue  # a queue created again: its counters restarted
                    rate_in += (stat.jobs_in - before.jobs_in) / elapsed
                    rate_out += max(0, stat.jobs_out - before.jobs_out) / elapsed
                row.rate_in, row.rate_out = rate_in, rate_out
        return Snapshot(rows, problems, now, now - started)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass


def node_order(nodes: list[Node]) -> list[str]:
    """Node addresses in the order pages list them."""
    return [n.address for n in nodes]
