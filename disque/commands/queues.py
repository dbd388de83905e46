"""Queue commands: QLEN QSTAT QPEEK PAUSE QLIMIT, and the iterators QSCAN JSCAN."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..federation import import_from, import_rate
from ..groups import oldest_waiting_age_ms
from ..job import JobState
from ..job_options import MAX_PRIORITY
from ..keyspace import SLICES
from ..protocol import NULL_ARRAY, OK, Map
from ..queue import set_pause, set_rate_limit
from ..queue_limit import MAX_LIMIT_JOBS, MAX_LIMIT_PERIOD_MS
from ..queue_order import priority_of
from ..queue_table import PAUSED_IN, PAUSED_OUT, pause_label
from ..waiters import getjob_entry
from .jobs import show_reply
from .registry import KEYS_QUEUE, SYNTAX_ERROR, CommandError, command, parse_int

if TYPE_CHECKING:
    from ..connection import ClientConnection
    from ..state import ServerState


@command("qlen", 2, "fast", keys=KEYS_QUEUE)
def qlen(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """QLEN queue: jobs queued in this node (0 if the queue does not exist),
    those waiting behind their group's next job included."""
    q = state.queues.lookup(argv[1])
    return len(q) if q is not None else 0


@command("qstat", 2, "fast", keys=KEYS_QUEUE)
def qstat(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """QSTAT queue: key/value statistics, or NULL."""
    q = state.queues.lookup(argv[1])
    if q is None:
        return None
    now = state.clock.now_ms()
    reply = Map([
        b"name", q.name,
        b"len", len(q),
        b"age", max(0, (now - q.ctime) // 1000),
        b"idle", max(0, (now - q.atime) // 1000),
        b"blocked", len(q.waiters),
        b"import-from", import_from(q, now),
        b"import-rate", import_rate(q, now),
        b"jobs-in", q.jobs_in,
        b"jobs-out", q.jobs_out,
        b"pause", pause_label(q.flags),
    ])
    if q.dead_lettered:
        # Extension (MAXDELIVERIES): only once this node dead-lettered jobs
        # of the queue, so an original client's QSTAT stays the original's.
        reply += [b"dead-lettered", q.dead_lettered]
    limit = q.limit
    if limit is not None:
        # Extension (QLIMIT): only on a rate-limited queue.
        reply += [b"rate-limit", [limit.max_jobs, limit.period_ms],
                  b"rate-limit-left", limit.left(now),
                  b"rate-limited", limit.limited]
    levels = q.jobs.priorities()
    if levels:
        # Extension (PRIORITY): queued jobs per priority above 0, highest
        # first, only while the queue holds some.
        reply += [b"priorities", [n for level in levels for n in level]]
    groups = q.groups
    if groups is not None:
        # Extension (GROUP): only while the queue has a group with jobs
        # queued or out.
        reply += [b"groups-held", groups.held,
                  b"groups-waiting", len(groups.blocked),
                  b"oldest-waiting-group-age", oldest_waiting_age_ms(q, now) // 1000]
    return reply


@command("qpeek", 3, "fast", keys=KEYS_QUEUE)
def qpeek(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """QPEEK queue count: the ``count`` jobs GETJOB hands out next, or the
    ``-count`` it hands out last (the last first)."""
    count = parse_int(argv[2])
    q = state.queues.lookup(argv[1])
    if q is None or count == 0:
        return []
    return [getjob_entry(job, 0) for job in q.peek(count)]


_PAUSE_OPTIONS = {b"in": PAUSED_IN, b"out": PAUSED_OUT, b"all": PAUSED_IN | PAUSED_OUT}


@command("pause", -3, "write fast", keys=KEYS_QUEUE)
def pause(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """PAUSE queue in|out|all|none|state|bcast ...: returns the resulting state."""
    new_flags = 0
    update = bcast = False
    for raw in argv[2:]:
        opt = raw.lower()
        if opt in _PAUSE_OPTIONS:
            new_flags |= _PAUSE_OPTIONS[opt]
            update = True
        elif opt == b"none":
            new_flags = 0
            update = True
        elif opt == b"state":
            pass
        elif opt == b"bcast":
            bcast = True
        else:
            raise CommandError(SYNTAX_ERROR)
    q = state.queues.lookup(argv[1])
    if update and (q is not None or new_flags):
        if q is None:
            q = state.queue_for_write(argv[1])
        set_pause(state, q, new_flags)
    flags = q.flags if q is not None else 0
    if bcast:
        state.cluster.broadcast_pause(argv[1], flags)
    return pause_label(flags).encode()


# --------------------------------------------------------------------------
# QLIMIT (an extension: queue_limit.py, docs/EXTENSIONS.md)
# --------------------------------------------------------------------------

QLIMIT_MAX_ERROR = (f"ERR QLIMIT max must be a number of jobs between 1 and {MAX_LIMIT_JOBS} "
                    "(PAUSE queue out stops a queue's output)")
QLIMIT_PERIOD_ERROR = (f"ERR QLIMIT period must be between 1 and {MAX_LIMIT_PERIOD_MS} "
                       "milliseconds")


@command("qlimit", -2, "write fast", keys=KEYS_QUEUE)
def qlimit(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """QLIMIT queue [max period-ms | OFF] [BCAST]: at most ``max`` jobs of the
    queue delivered per ``period-ms`` on this node (BCAST: on every node of
    ours too).  Without a limit to set: ``[max, period-ms]``, or null."""
    args = argv[2:]
    bcast = bool(args) and args[-1].lower() == b"bcast"
    if bcast:
        args = args[:-1]
    q = state.queues.lookup(argv[1])
    if not args and not bcast:
        limit = q.limit if q is not None else None
        return [limit.max_jobs, limit.period_ms] if limit is not None else NULL_ARRAY
    off = args[0].lower() == b"off" if args else False
    if off and len(args) == 1:
        max_jobs = period_ms = 0
    elif len(args) == 2 and not off:
        max_jobs = parse_int(args[0], QLIMIT_MAX_ERROR, 1, MAX_LIMIT_JOBS, QLIMIT_MAX_ERROR)
        period_ms = parse_int(args[1], QLIMIT_PERIOD_ERROR, 1, MAX_LIMIT_PERIOD_MS,
                              QLIMIT_PERIOD_ERROR)
    else:
        raise CommandError(SYNTAX_ERROR)
    if q is None and max_jobs:
        q = state.queue_for_write(argv[1])
    if q is not None:
        set_rate_limit(state, q, max_jobs, period_ms)
    if bcast:
        state.cluster.broadcast_qlimit(argv[1], max_jobs, period_ms)
    return OK


# --------------------------------------------------------------------------
# QSCAN / JSCAN
# --------------------------------------------------------------------------

def _scan_cursor(raw: bytes) -> int | None:
    """An unsigned number in cursor form, or None.

    A number too long to be any cursor is still meant as one: it gets
    "invalid cursor" (from _check_cursor), not "syntax error".
    """
    if not raw.isdigit():
        return None
    return int(raw) if len(raw) <= 20 else 2 ** 64


MINPRIORITY_ERROR = f"ERR MINPRIORITY must be between 0 and {MAX_PRIORITY}"


def _parse_min_priority(raw: bytes) -> int:
    return parse_int(raw, MINPRIORITY_ERROR, 0, MAX_PRIORITY, MINPRIORITY_ERROR)


def _check_cursor(cursor: int) -> int:
    if cursor >= SLICES:
        raise CommandError("ERR invalid cursor")
    return cursor


@command("qscan", -1, "", categories="keyspace")
def qscan(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE n]
    [MINPRIORITY p]: MINPRIORITY (an extension) keeps the queues holding a
    queued job of priority ``p`` or higher."""
    cursor: int | None = None
    count = 100
    busyloop = False
    minlen = maxlen = importrate = -1
    min_priority = 0
    i, n = 1, len(argv)
    while i < n:
        opt = argv[i].lower()
        has_value = i + 1 < n
        if opt == b"count" and has_value:
            count = parse_int(argv[i + 1], "ERR COUNT must be a number greater than zero", 1)
            i += 2
        elif opt == b"busyloop":
            busyloop = True
            i += 1
        elif opt == b"minlen" and has_value:
            minlen = parse_int(argv[i + 1], "ERR MINLEN must be a non negative number", 0)
            i += 2
        elif opt == b"maxlen" and has_value:
            maxlen = parse_int(argv[i + 1], "ERR MAXLEN must be a non negative number", 0)
            i += 2
        elif opt == b"importrate" and has_value:
            importrate = parse_int(argv[i + 1], "ERR IMPORTRATE must be a non negative number", 0)
            i += 2
        elif opt == b"minpriority" and has_value:
            min_priority = _parse_min_priority(argv[i + 1])
            i += 2
        elif cursor is None and _scan_cursor(argv[i]) is not None:
            cursor = _check_cursor(_scan_cursor(argv[i]))  # type: ignore[arg-type]
            i += 1
        else:
            raise CommandError(SYNTAX_ERROR)

    now = state.clock.now_ms()
    # A user limited to some queues sees only those (their names are not
    # for every team to read).
    user = client.user
    visible = user.may_access if user is not None and not user.all_queues else None

    def accept(q) -> bool:
        qlen = len(q)
        return ((minlen < 0 or qlen >= minlen) and (maxlen < 0 or qlen <= maxlen)
                and (importrate < 0 or import_rate(q, now) >= importrate)
                and (not min_priority or q.jobs.top_priority() >= min_priority)
                and (visible is None or visible(q.name)))

    return _run_scan(state.queues.scan, cursor or 0, count, busyloop, accept,
                     lambda q: q.name)


_REPLY_TYPES = (b"all", b"id")


@command("jscan", -1, "", categories="keyspace")
def jscan(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s ...] [MINPRIORITY p]
    [GROUP key] [REPLY all|id]: MINPRIORITY and GROUP (extensions) keep jobs of
    priority ``p`` or higher, and jobs of group ``key``."""
    cursor: int | None = None
    count = 100
    busyloop = False
    min_priority = 0
    queue: bytes | None = None
    group: bytes | None = None
    states: set[int] = set()
    reply_all = False
    i, n = 1, len(argv)
    while i < n:
        opt = argv[i].lower()
        has_value = i + 1 < n
        if opt == b"count" and has_value:
            count = parse_int(argv[i + 1], "ERR COUNT must be a number greater than zero", 1)
            i += 2
        elif opt == b"busyloop":
            busyloop = True
            i += 1
        elif opt == b"queue" and has_value:
            queue = argv[i + 1]
            i += 2
        elif opt == b"state" and has_value:
            job_state = JobState.from_label(argv[i + 1].decode("latin-1"))
            if job_state is None:
                raise CommandError("ERR Invalid job state name: use wait-repl, active, "
                                   "queued or acked")
            states.add(int(job_state))
            i += 2
        elif opt == b"minpriority" and has_value:
            min_priority = _parse_min_priority(argv[i + 1])
            i += 2
        elif opt == b"group" and has_value:
            group = argv[i + 1]
            i += 2
        elif opt == b"reply" and has_value:
            kind = argv[i + 1].lower()
            if kind not in _REPLY_TYPES:
                raise CommandError("ERR Invalid REPLY type, try ALL or ID")
            reply_all = kind == b"all"
            i += 2
        elif cursor is None and _scan_cursor(argv[i]) is not None:
            cursor = _check_cursor(_scan_cursor(argv[i]))  # type: ignore[arg-type]
            i += 1
        else:
            raise CommandError(SYNTAX_ERROR)

    # A user limited to some queues sees only their jobs (bodies included).
    user = client.user
    visible = user.may_access if user is not None and not user.all_queues else None

    def accept(job) -> bool:
        return ((queue is None or job.queue == queue) and (not states or job.state in states)
                and (not min_priority or priority_of(job) >= min_priority)
                and (group is None or (job.ext is not None and job.ext.group == group))
                and (visible is None or (job.queue is not None and visible(job.queue))))

    now = state.clock.now_ms()
    render = (lambda job: show_reply(job, now)) if reply_all else (lambda job: job.id)
    return _run_scan(state.jobs.scan, cursor or 0, count, busyloop, accept, render)


def _run_scan(scan, cursor: int, count: int, busyloop: bool, accept, render) -> list[Any]:
    items: list[Any] = []
    while True:
        cursor, found = scan(cursor, count, accept)
        items.extend(render(v) for v in found)
        if not busyloop or cursor == 0:
            break
    return [str(cursor).encode(), items]
