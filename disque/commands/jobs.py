"""Job commands: ADDJOB GETJOB ACKJOB FASTACK NACK WORKING[S] ENQUEUE DEQUEUE DELJOB SHOW."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .. import ack
from ..federation import import_rate, need_jobs
from ..headers import limits_refusal, name_refusal
from ..idmp import DEFAULT_WINDOW_S, MAX_KEY_BYTES, MAX_WINDOW_S, DedupEntry, body_digest
from ..job import ACTIVE, FLAG_BCAST_WILLQUEUE, WAIT_REPL, Job, JobState
from ..job_options import (
    DEAD_SUFFIX,
    GROUP_EMPTY,
    MAX_PRIORITY,
    JobExt,
    dead_letter_queue,
    group_refusal,
    retry_seconds,
)
from ..jobs import register_job, unregister_job
from ..protocol import NULL_ARRAY, Encoded, Map, ReplyError, Status, status_reply
from ..queue import (
    dequeue_job,
    enqueue_job,
    fetch_job,
    fetch_jobs,
    nack_job,
    wake_when_window_opens,
)
from ..queue_table import PAUSED_IN, PAUSED_OUT
from ..replication import replicate_job
from ..schedule import requeue_time, update_awake_time
from ..waiters import (
    WITH_COUNTERS,
    WITH_GROUP,
    WITH_HEADERS,
    WITH_LEASE,
    block_for_jobs,
    entries_reply,
    getjob_entry,
)
from ..waitjob import completion_of, wait_for
from .registry import (
    BLOCKED,
    FROM,
    KEYS_FROM,
    KEYS_JOBS,
    KEYS_QUEUE,
    SYNTAX_ERROR,
    CommandClient,
    CommandError,
    NativeHandler,
    OptionName,
    command,
    is_option,
    parse_int,
    parse_job_ids,
    parse_timeout_ms,
    queue_name_refusal,
    queue_refusal,
    queues_refusal,
)

if TYPE_CHECKING:
    from ..state import ServerState

DEFAULT_TTL: Final = 86400
MAX_RETRY_DEFAULT: Final = 300
#: Jobs live at most ~10 years: far beyond any use, and keeps times in range.
MAX_TTL: Final = 10 * 365 * 86400
#: RETRY/DELAY are stored as unsigned 32-bit seconds (the serialized form).
MAX_SECONDS: Final = 2 ** 32 - 1


DELAY_AFTER_TTL: Final = ("ERR The specified DELAY is greater than TTL. Job refused since "
                   "would never be delivered")


#: MAXDELIVERIES is compared with the original's delivery counters, 16-bit in its blob.
MAX_DELIVERIES: Final = 65535
#: A NACK may delay a job at most as long as a job may live.
MAX_NACK_DELAY: Final = MAX_TTL
NACK_DELAY_ERROR: Final = (
    f"ERR NACK DELAY must be a number of seconds between 0 and {MAX_NACK_DELAY}")


class AddJobOptions:
    __slots__ = ("async_", "backoff", "dead_letter", "delay", "group", "headers", "idmp",
                 "idmp_window", "max_deliveries", "maxlen", "priority", "replicate", "retry",
                 "timeout", "ttl")

    def __init__(self) -> None:
        self.replicate: int | None = None
        self.ttl = DEFAULT_TTL
        self.retry = -1
        self.delay = 0
        self.maxlen = 0
        self.async_ = False
        self.timeout = 0
        # Extensions (disque.job_options): 0 / None when not given.
        self.backoff = 0
        self.max_deliveries = 0
        self.dead_letter: bytes | None = None
        self.idmp: bytes | None = None
        self.idmp_window = -1
        self.priority = 0
        #: HEADER name value ..., flat (disque.headers); None: no HEADER.
        self.headers: list[bytes] | None = None
        #: GROUP key (disque.groups); None: no GROUP.
        self.group: bytes | None = None


# Built once: an f-string argument is formatted on every call, error or not
# (formatting a number costs more than parsing the option).
_TTL_TOO_BIG: Final = f"ERR TTL must be a number > 0 and at most {MAX_TTL} (10 years)"
_RETRY_TOO_BIG: Final = ("ERR RETRY time must be a non negative number "
                         f"not greater than {MAX_SECONDS}")
_BACKOFF_TOO_BIG: Final = ("ERR BACKOFF must be a number of seconds > 0 "
                           f"not greater than {MAX_SECONDS}")
_MAXDELIVERIES_ERROR: Final = f"ERR MAXDELIVERIES must be between 1 and {MAX_DELIVERIES}"
PRIORITY_ERROR: Final = f"ERR PRIORITY must be between 0 and {MAX_PRIORITY}"

_REPLICATE: Final = OptionName(b"replicate")
_TTL: Final = OptionName(b"ttl")
_RETRY: Final = OptionName(b"retry")
_DELAY: Final = OptionName(b"delay")
_MAXLEN: Final = OptionName(b"maxlen")
_ASYNC: Final = OptionName(b"async")

#: ADDJOB without options (the common case) shares one options object.
_DEFAULT_OPTIONS: Final = AddJobOptions()


def parse_addjob(argv: list[bytes]) -> AddJobOptions:
    """The options after ``ADDJOB queue body timeout`` (the timeout is checked too)."""
    n = len(argv)
    if n == 4 and argv[3] == b"0":
        return _DEFAULT_OPTIONS
    opts = AddJobOptions()
    i = 4
    while i < n:
        arg = argv[i]
        has_value = i + 1 < n
        if is_option(arg, _REPLICATE) and has_value:
            opts.replicate = parse_int(argv[i + 1], "ERR REPLICATE must be between 1 and 65535",
                                       1, 65535, "ERR REPLICATE must be between 1 and 65535")
            i += 2
        elif is_option(arg, _TTL) and has_value:
            opts.ttl = parse_int(argv[i + 1], "ERR TTL must be a number > 0", 1, MAX_TTL,
                                 _TTL_TOO_BIG)
            i += 2
        elif is_option(arg, _RETRY) and has_value:
            opts.retry = parse_int(argv[i + 1], "ERR RETRY time must be a non negative number",
                                   0, MAX_SECONDS, _RETRY_TOO_BIG)
            i += 2
        elif is_option(arg, _DELAY) and has_value:
            # Any DELAY too big to be a number is also beyond the TTL: say that.
            opts.delay = parse_int(argv[i + 1], "ERR DELAY time must be a non negative number",
                                   0, too_big=DELAY_AFTER_TTL)
            i += 2
        elif is_option(arg, _MAXLEN) and has_value:
            opts.maxlen = parse_int(argv[i + 1], "ERR MAXLEN must be a positive number", 1)
            i += 2
        elif is_option(arg, _ASYNC):
            opts.async_ = True
            i += 1
        elif not has_value:
            raise CommandError(SYNTAX_ERROR)
        else:
            # The extensions' options, less common: one lower() for them all.
            opt = arg.lower()
            if opt == b"header":
                if i + 2 >= n:
                    raise CommandError(SYNTAX_ERROR)
                _add_header(opts, argv[i + 1], argv[i + 2])
                i += 3
                continue
            if opt in _EXTENSION_OPTIONS:
                _parse_extension_option(opts, opt, argv[i + 1])
            elif opt == b"group":
                if opts.group is not None:
                    raise CommandError(GROUP_TWICE)
                opts.group = _group_key(argv[i + 1])
            elif opt == b"idmp":
                opts.idmp = parse_idmp_key(argv[i + 1])
            elif opt == b"idmp-window":
                opts.idmp_window = parse_int(argv[i + 1], IDMP_WINDOW_ERROR, 1, MAX_WINDOW_S,
                                             IDMP_WINDOW_ERROR)
            else:
                raise CommandError(SYNTAX_ERROR)
            i += 2
    if opts.idmp_window != -1 and opts.idmp is None:
        raise CommandError("ERR IDMP-WINDOW needs IDMP <key>")
    if opts.delay and opts.group is not None:
        raise CommandError(GROUP_DELAY)
    opts.timeout = parse_timeout_ms(argv[3])
    return opts


# --------------------------------------------------------------------------
# GROUP (ordered groups, an extension: groups.py, docs/EXTENSIONS.md)
# --------------------------------------------------------------------------

GROUP_TWICE: Final = "ERR GROUP may be given only once"
GROUP_DELAY: Final = ("ERR DELAY can't be used with GROUP: a group's jobs go out in the order "
                      "they were added")


def _group_key(raw: bytes) -> bytes:
    """GROUP's key, checked as far as it can be without the config (its
    length: :func:`group_key_refusal`)."""
    if not raw:
        raise CommandError(GROUP_EMPTY)
    return bytes(raw)


def group_key_refusal(state: ServerState, key: bytes) -> ReplyError | None:
    """The error for a GROUP key over max-group-key-len."""
    refused = group_refusal(key, state.config.max_group_key_len)
    return ReplyError(refused) if refused is not None else None


_EXTENSION_OPTIONS: Final = frozenset((b"backoff", b"maxdeliveries", b"deadletter", b"priority"))


def _add_header(opts: AddJobOptions, name: bytes, value: bytes) -> None:
    """HEADER name value (disque/headers.py): the name is text, the value any bytes."""
    refused = name_refusal(name)
    if refused is not None:
        raise CommandError(refused)
    headers = opts.headers
    if headers is None:
        headers = opts.headers = []
    headers.append(name)
    headers.append(value)


def headers_refusal(state: ServerState, opts: AddJobOptions) -> ReplyError | None:
    """The error for HEADERs beyond max-job-headers or max-job-headers-size."""
    headers = opts.headers
    if headers is None:
        return None
    config = state.config
    refused = limits_refusal(headers, config.max_job_headers, config.max_job_headers_size)
    return ReplyError(refused) if refused is not None else None


def _parse_extension_option(opts: AddJobOptions, opt: bytes, value: bytes) -> None:
    """BACKOFF s, MAXDELIVERIES n, DEADLETTER queue, PRIORITY p (docs/EXTENSIONS.md)."""
    if opt == b"priority":
        opts.priority = parse_int(value, PRIORITY_ERROR, 0, MAX_PRIORITY, PRIORITY_ERROR)
    elif opt == b"backoff":
        opts.backoff = parse_int(value, "ERR BACKOFF must be a number of seconds > 0", 1,
                                 MAX_SECONDS, _BACKOFF_TOO_BIG)
    elif opt == b"maxdeliveries":
        opts.max_deliveries = parse_int(value, _MAXDELIVERIES_ERROR, 1, MAX_DELIVERIES,
                                        _MAXDELIVERIES_ERROR)
    else:
        if not value:
            raise CommandError("ERR DEADLETTER queue name can't be empty")
        opts.dead_letter = value


def job_ext_for(opts: AddJobOptions, queue: bytes, retry: int) -> JobExt | None:
    """The extension options of a new job (None without any), checked
    against the rest of the job once RETRY is known."""
    headers = tuple(opts.headers) if opts.headers is not None else ()
    group = opts.group
    if not (opts.backoff or opts.max_deliveries or opts.dead_letter is not None):
        if opts.priority or headers or group is not None:
            return JobExt(priority=opts.priority, headers=headers, group=group)
        return None
    if retry == 0:
        raise CommandError("ERR BACKOFF and MAXDELIVERIES need RETRY > 0 (an at-most-once "
                           "job is never queued again)")
    if opts.backoff and opts.backoff < retry:
        raise CommandError(f"ERR BACKOFF must not be smaller than RETRY ({retry} seconds), "
                           "the first re-queue delay it grows from")
    if opts.dead_letter is not None:
        if not opts.max_deliveries:
            raise CommandError("ERR DEADLETTER needs MAXDELIVERIES")
        if opts.dead_letter == queue:
            raise CommandError("ERR DEADLETTER queue must not be the job's own queue")
    return JobExt(opts.backoff, opts.max_deliveries, opts.dead_letter or b"",
                  priority=opts.priority, headers=headers, group=group)


# --------------------------------------------------------------------------
# IDMP (idempotent ADDJOB, an extension: idmp.py, docs/EXTENSIONS.md)
# --------------------------------------------------------------------------

IDMP_WINDOW_ERROR: Final = f"ERR IDMP-WINDOW must be between 1 and {MAX_WINDOW_S} seconds"
IDMP_BUSY: Final = ("IDMPBUSY The first ADDJOB with this IDMP key is still waiting for its "
             "replication: retry later")


def parse_idmp_key(raw: bytes) -> bytes:
    if not 0 < len(raw) <= MAX_KEY_BYTES:
        raise CommandError(f"ERR IDMP key must be 1 to {MAX_KEY_BYTES} bytes long")
    return bytes(raw)


def idmp_seen(entry: DedupEntry, body: bytes, state: ServerState) -> Any:
    """The reply to a retried ADDJOB whose key is in the index."""
    if entry.pending:
        return ReplyError(IDMP_BUSY)
    if entry.digest != body_digest(body):
        state.idmp.conflicts += 1
        return ReplyError(f"IDMPCONFLICT IDMP key already used in this queue within its "
                          f"window for job {entry.job_id.decode()} with a different body")
    state.idmp.hits += 1
    return status_reply(entry.job_id)


def idmp_record(state: ServerState, opts: AddJobOptions, queue: bytes, body: bytes,
                job_id: bytes, now: int, pending: bool) -> None:
    """Index the new job's key (pending while its ADDJOB waits for copies)."""
    assert opts.idmp is not None
    window = opts.idmp_window if opts.idmp_window != -1 else DEFAULT_WINDOW_S
    entry = DedupEntry(queue, opts.idmp, job_id, body_digest(body), now + window * 1000, pending)
    if state.idmp.add(entry):
        state.events.idmp_settled(state, entry)


def addjob(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """ADDJOB queue body ms-timeout [REPLICATE n] [DELAY s] [RETRY s] [TTL s] [MAXLEN n] [ASYNC]
    [BACKOFF s] [MAXDELIVERIES n] [DEADLETTER queue] [PRIORITY p] [IDMP key [IDMP-WINDOW s]]
    [HEADER name value ...] [GROUP key]"""
    opts = parse_addjob(argv)
    if opts.headers is not None:
        refused = headers_refusal(state, opts)
        if refused is not None:
            return refused
    if opts.group is not None:
        refused = group_key_refusal(state, opts.group)
        if refused is not None:
            return refused
    if opts.dead_letter is not None and len(opts.dead_letter) > state.max_queue_name_len:
        return queue_name_refusal(state, opts.dead_letter)
    if opts.max_deliveries:
        user = client.user
        if user is not None and not user.all_queues:
            # The job may move to its dead-letter queue, named or <queue>:dead.
            dead = opts.dead_letter if opts.dead_letter is not None else argv[1] + DEAD_SUFFIX
            refused = queue_refusal(state, user, dead)
            if refused is not None:
                return refused
    now = state.clock.now_ms()
    if opts.idmp is not None:
        # First, so that a retry gets its ID even if the queue is now paused or full.
        seen = state.idmp.lookup(argv[1], opts.idmp, now)
        if seen is not None:
            return idmp_seen(seen, argv[2], state)
    cluster = state.cluster
    size, reachable = cluster.addjob_counts(now)
    replicate = opts.replicate if opts.replicate is not None else min(3, size)
    ttl = opts.ttl
    retry = opts.retry
    delay = opts.delay
    if replicate > 1 and retry == 0:
        raise CommandError("ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 "
                           "(at-most-once delivery)")
    if delay >= ttl:
        raise CommandError(DELAY_AFTER_TTL)
    if retry == -1:
        retry = max(1, min(MAX_RETRY_DEFAULT, ttl // 10))
    ext = None if opts is _DEFAULT_OPTIONS else job_ext_for(opts, argv[1], retry)

    # External replication (no local copy) when leaving, or when memory is
    # tight and other nodes can take the copies.  A node that cannot hand
    # the job to anybody keeps it while under the hard limit: refusing every
    # job at 75% (the original on a lone node) helps nobody.
    leaving = cluster.leaving
    # All bools (``reachable > 0``, not ``reachable``): compiled, an int in
    # the expression would make it an object, boxed.
    extrepl = leaving or (reachable > 0 and replicate <= reachable
                          and state.memory.level() >= 1)
    needed = replicate if extrepl else replicate - 1
    if needed > reachable:
        reason = ""
        if extrepl and needed - 1 == reachable:
            why = "I'm leaving the cluster" if leaving else "I'm out of memory"
            reason = (", since I'm unable to hold a copy of the message for the following "
                      f"reason: {why}")
        return ReplyError(f"NOREPL Not enough reachable nodes for the requested "
                          f"replication level{reason}")

    q = state.queues.lookup(argv[1])
    if q is not None:
        if opts.maxlen and len(q) >= opts.maxlen:
            return ReplyError("MAXLEN Queue is already longer than the specified MAXLEN count")
        if q.flags & PAUSED_IN:
            return ReplyError("PAUSED Queue paused in input, try later")
    if q is None:
        q = state.queue_for_write(argv[1])
    if needed > 0:
        job = Job(state.ids.next_id(ttl, retry), q.name, argv[2], WAIT_REPL, replicate,
                  state.next_ctime(now), now + ttl * 1000, delay, retry)
        job.ext = ext
        if opts.idmp is not None:
            idmp_record(state, opts, q.name, argv[2], job.id, now, pending=True)
        state.stats.added_jobs += 1
        reply = replicate_job(state, client, job, needed, bool(extrepl), opts.timeout,
                              opts.async_, now)
        if reply is None:
            return BLOCKED  # the entry is settled when the ADDJOB answers
        if opts.idmp is not None:
            settled = state.idmp.settle(job.id, not isinstance(reply, ReplyError))
            if settled is not None:
                state.events.idmp_settled(state, settled)
        return reply

    job = Job(state.ids.next_id(ttl, retry), q.name, argv[2], ACTIVE, replicate,
              state.next_ctime(now), state.shared_int(now + ttl * 1000), delay, retry,
              cluster.myself_set)
    job.ext = ext
    if delay:
        job.qtime = now + delay * 1000
    else:
        # Queue it before registering so the schedule gets one entry, not two.
        job.qtime = now
        enqueue_job(state, job, q=q, now=now)
    register_job(state, job)
    state.events.job_stored(state, job)
    state.stats.added_jobs += 1
    if opts.idmp is not None:
        idmp_record(state, opts, q.name, argv[2], job.id, now, pending=False)
    return Encoded(state.ids.status_line(job.id))


class _AddJob(NativeHandler):
    def run(self, state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
        return addjob(state, client, argv)


# Not a decorator: the command table calls ``_AddJob`` (NativeHandler), which
# calls ``addjob`` in C only as long as it is undecorated.
command("addjob", -4, "write denyoom", keys=KEYS_QUEUE, native=_AddJob())(addjob)


# --------------------------------------------------------------------------
# GETJOB
# --------------------------------------------------------------------------

LEAVING_ERROR: Final = ("LEAVING This node is leaving the cluster, please connect to a "
                 "different one")


def _take_jobs(state: ServerState, queues: list[bytes], count: int,
               fields: int) -> list[list[Any]] | Encoded:
    """Up to ``count`` GETJOB entries (already encoded, or none, for the
    usual GETJOB of one queue without extra fields): one job per queue per
    pass, left to right."""
    # Not a local bound to ``state.queues.lookup``: compiled, calling that
    # is a Python-level call (~600 instructions), the method's a C call.
    table = state.queues
    if len(queues) == 1:  # the usual case: take them in one go
        q = table.lookup(queues[0])
        if q is None or q.flags & PAUSED_OUT:
            return []
        jobs = fetch_jobs(state, q, count)
        return entries_reply(state, q, jobs, fields) if jobs else []
    now = state.clock.now_ms() if fields & WITH_LEASE else 0
    emitted: list[list[Any]] = []
    # Per queue with ordered groups, the job taken from it last: the jobs
    # waiting behind it in its group may follow (queue.fetch_jobs).
    runs: dict[bytes, Job] | None = None
    while True:
        before = len(emitted)
        for name in queues:
            q = table.lookup(name)
            if q is None or q.flags & PAUSED_OUT:
                continue
            after = runs.get(name) if runs is not None else None
            if not q.jobs and after is None:
                continue
            job = fetch_job(state, q, after)
            if job is None:
                continue
            if q.groups is not None:
                if runs is None:
                    runs = {}
                runs[name] = job
            emitted.append(getjob_entry(job, fields, now))
            if len(emitted) >= count:
                return emitted
        if len(emitted) == before:
            return emitted


_COUNT: Final = OptionName(b"count")
_TIMEOUT: Final = OptionName(b"timeout")
_NOHANG: Final = OptionName(b"nohang")
_WITHCOUNTERS: Final = OptionName(b"withcounters")
_WITHLEASE: Final = OptionName(b"withlease")
_WITHHEADERS: Final = OptionName(b"withheaders")
_WITHGROUP: Final = OptionName(b"withgroup")


def getjob(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] [WITHLEASE] [WITHHEADERS]
    [WITHGROUP] FROM q1 q2 ...

    WITHLEASE, WITHHEADERS and WITHGROUP are extensions: each entry ends with
    ``next-requeue-within`` (milliseconds, nil for RETRY 0), as SHOW has it,
    then with ``headers`` and the job's headers (a flat array, name, value ...),
    then with ``group-position`` and the job's position in its group (its
    ctime, the order the group's jobs go out in) and ``group`` and its
    group key (both nil without one).
    """
    nohang = False
    fields = 0
    timeout = 0
    count = 1
    queues: list[bytes] | None = None  # FROM's slice of argv: no empty list first
    i, n = 1, len(argv)
    while i < n:
        arg = argv[i]
        has_value = i + 1 < n
        if is_option(arg, FROM):
            queues = argv[i + 1:]
            break
        if is_option(arg, _COUNT) and has_value:
            count = parse_int(argv[i + 1], "ERR COUNT must be a number greater than zero", 1)
            i += 1
        elif is_option(arg, _TIMEOUT) and has_value:
            timeout = parse_timeout_ms(argv[i + 1])
            i += 1
        elif is_option(arg, _NOHANG):
            nohang = True
        elif is_option(arg, _WITHCOUNTERS):
            fields |= WITH_COUNTERS
        elif is_option(arg, _WITHLEASE):
            fields |= WITH_LEASE
        elif is_option(arg, _WITHHEADERS):
            fields |= WITH_HEADERS
        elif is_option(arg, _WITHGROUP):
            fields |= WITH_GROUP
        else:
            raise CommandError(SYNTAX_ERROR)
        i += 1
    if queues is None or not queues:
        raise CommandError(SYNTAX_ERROR)
    if len(queues) > 1 or len(queues[0]) > state.max_queue_name_len:
        refused = queues_refusal(state, queues)
        if refused is not None:
            return refused

    emitted = _take_jobs(state, queues, count, fields)
    federated = len(state.cluster.nodes) > 1
    if emitted:
        if federated:
            _ask_when_emptied(state, queues)
        return emitted
    if federated:
        # Nothing here: ask the other nodes (federation), also for NOHANG
        # pollers, so that a later poll finds the jobs.
        for name in queues:
            need_jobs(state, state.queue_for_write(name))
    if nohang:
        return NULL_ARRAY
    if state.cluster.leaving:
        return ReplyError(LEAVING_ERROR)
    blocked = block_for_jobs(state, client, queues, timeout, fields)
    for q in blocked.queues:
        if q.limit is not None and q.jobs:
            wake_when_window_opens(state, q)  # jobs held back by the rate limit
    return BLOCKED


class _GetJob(NativeHandler):
    def run(self, state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
        return getjob(state, client, argv)


command("getjob", -3, "write", keys=KEYS_FROM, categories="blocking", native=_GetJob())(getjob)


def _ask_when_emptied(state: ServerState, queues: list[bytes]) -> None:
    """A fetch emptied a queue that imports jobs: ask its responders at once."""
    for name in queues:
        q = state.queues.lookup(name)
        if (q is not None and not q.jobs and q.fed is not None
                and import_rate(q, state.clock.now_ms())):
            need_jobs(state, q, reached_zero=True)


# --------------------------------------------------------------------------
# ACKs
# --------------------------------------------------------------------------

@command("ackjob", -2, "write fast", keys=KEYS_JOBS)
def ackjob(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """ACKJOB id ...: acknowledge; returns how many known jobs were newly acked.

    A user limited to some queues acks only jobs this node holds: a dummy
    ACK for an unknown ID would reach jobs of any queue on other nodes.
    """
    known = 0
    user = client.user
    restricted = user is not None and not user.all_queues
    for job_id in parse_job_ids(argv[1:]):
        job = state.jobs.get(job_id)
        if job is None:
            if restricted:
                continue
            job = ack.create_dummy_ack(state, job_id)
        elif ack.acknowledge_job(state, job, gc_follows=True):
            known += 1
        if job is not None:
            ack.try_job_gc(state, job)
    state.stats.acked_jobs += known
    return known


@command("fastack", -2, "write fast", keys=KEYS_JOBS)
def fastack(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """FASTACK id ...: best-effort cluster-wide delete; returns known jobs deleted.

    A user limited to some queues deletes only jobs this node holds (see ACKJOB).
    """
    user = client.user
    restricted = user is not None and not user.all_queues
    deleted = sum(ack.fast_ack(state, job_id) for job_id in parse_job_ids(argv[1:])
                  if not restricted or state.jobs.get(job_id) is not None)
    state.stats.acked_jobs += deleted
    return deleted


# --------------------------------------------------------------------------
# Visibility: NACK ENQUEUE DEQUEUE WORKING DELJOB
# --------------------------------------------------------------------------

def _enqueue_ids(state: ServerState, ids: list[bytes]) -> int:
    enqueued = 0
    for job_id in parse_job_ids(ids):
        job = state.jobs.get(job_id)
        if job is not None and job.state == JobState.ACTIVE and enqueue_job(state, job):
            enqueued += 1
    return enqueued


def _parse_nack(argv: list[bytes]) -> tuple[list[bytes], int | None]:
    """NACK's job IDs and its DELAY (None without).

    ``DELAY s`` is recognised only as the last two arguments after at least
    one ID; anything else is checked as job IDs, so whatever the original
    answered -BADID still gets -BADID (a bad DELAY value aside).
    """
    n = len(argv)
    if n >= 4 and argv[n - 2].lower() == b"delay":
        job_ids = parse_job_ids(argv[1:n - 2])
        return job_ids, parse_int(argv[n - 1], NACK_DELAY_ERROR, 0, MAX_NACK_DELAY,
                                  NACK_DELAY_ERROR)
    return parse_job_ids(argv[1:]), None


@command("nack", -2, "write denyoom fast", keys=KEYS_JOBS)
def nack(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """NACK id ... [DELAY s]: requeue now (or in ``s`` seconds, or after the
    job's BACKOFF), counting a negative acknowledge."""
    job_ids, delay = _parse_nack(argv)
    nacked = 0
    for job_id in job_ids:
        job = state.jobs.get(job_id)
        if job is not None and job.state == JobState.ACTIVE and nack_job(state, job, delay):
            nacked += 1
    return nacked


@command("enqueue", -2, "write denyoom fast", keys=KEYS_JOBS)
def enqueue(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """ENQUEUE id ...: queue jobs that are not queued."""
    return _enqueue_ids(state, argv[1:])


@command("dequeue", -2, "write fast", keys=KEYS_JOBS)
def dequeue(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """DEQUEUE id ...: take queued jobs out of their queue."""
    dequeued = 0
    for job_id in parse_job_ids(argv[1:]):
        job = state.jobs.get(job_id)
        if job is not None and dequeue_job(state, job):
            dequeued += 1
    return dequeued


@command("deljob", -2, "write fast", keys=KEYS_JOBS)
def deljob(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """DELJOB id ...: delete jobs from this node only."""
    deleted = 0
    for job_id in parse_job_ids(argv[1:]):
        job = state.jobs.get(job_id)
        if job is not None:
            unregister_job(state, job)
            deleted += 1
    return deleted


@command("working", 2, "write fast", keys=KEYS_JOBS)
def working(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """WORKING id: postpone the next requeue by RETRY; returns RETRY in seconds."""
    (job_id,) = parse_job_ids(argv[1:])
    return _working(state, job_id)


#: IDs per WORKINGS: one command runs to completion before the node serves
#: anybody else (10,000 heartbeats take ~20 ms here).
MAX_WORKING_IDS: Final = 10_000


@command("workings", -2, "write fast", keys=KEYS_JOBS)
def workings(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """WORKINGS id [id ...] (an extension): WORKING for each ID, in one command.

    The reply is an array with, per ID in order, what WORKING would have
    answered: the seconds, or its error (``-NOJOB``, ``-ACKED``,
    ``-TOOLATE``).  A malformed ID refuses the whole command (``-BADID``),
    as ACKJOB does, before any job is touched.
    """
    ids = parse_job_ids(argv[1:])
    if len(ids) > MAX_WORKING_IDS:
        raise CommandError(f"ERR too many IDs: WORKINGS takes at most {MAX_WORKING_IDS}")
    return [_working(state, job_id) for job_id in ids]


def _working(state: ServerState, job_id: bytes) -> Any:
    job = state.jobs.get(job_id)
    if job is None:
        return ReplyError("NOJOB Job not known in the context of this node.")
    if job.state == JobState.ACKED:
        # The original's README documents this error; its C code accepted the WORKING.
        return ReplyError("ACKED Job already acknowledged.")
    now = state.clock.now_ms()
    created = job.ctime // 1_000_000
    if now - created > (job.etime - created) // 2:
        return ReplyError("TOOLATE Half of job TTL already elapsed, you are no longer allowed "
                          "to postpone the next delivery.")
    dequeue_job(state, job)
    retry = retry_seconds(job)  # RETRY, or the job's current back-off
    if retry:
        job.flags |= FLAG_BCAST_WILLQUEUE
        job.qtime = requeue_time(state, retry, now)
        update_awake_time(state, job)
    state.cluster.broadcast_working(job)
    return retry


# --------------------------------------------------------------------------
# WAITJOB (an extension: waitjob.py, docs/EXTENSIONS.md)
# --------------------------------------------------------------------------

@command("waitjob", 3, "", keys=KEYS_JOBS, categories="blocking")
def waitjob(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """WAITJOB id ms-timeout: block until the job is acked (+ACKED), null on timeout."""
    (job_id,) = parse_job_ids(argv[1:2])
    timeout = parse_timeout_ms(argv[2])
    reply = completion_of(state, job_id)
    if reply is not None:
        return reply
    wait_for(state, client, job_id, timeout)
    return BLOCKED


# --------------------------------------------------------------------------
# SHOW
# --------------------------------------------------------------------------

def show_reply(job: Job, now: int, with_body: bool = True) -> Map:
    """The SHOW key/value reply (also JSCAN REPLY all); without the body
    (SHOW id NOBODY, an extension), ``body-size`` in its place."""
    qtime = job.qtime if job.state in (JobState.ACTIVE, JobState.QUEUED) and job.qtime else 0
    reply = Map([
        b"id", job.id,
        b"queue", job.queue,
        b"state", Status(JobState(job.state).label),
        b"repl", job.repl,
        b"ttl", max(0, (job.etime - now) // 1000),
        b"ctime", job.ctime,
        b"delay", job.delay,
        b"retry", job.retry,
        b"nacks", job.nacks,
        b"additional-deliveries", job.additional_deliveries,
        b"nodes-delivered", sorted(job.delivered),
        b"nodes-confirmed", sorted(job.confirmed),
        b"next-requeue-within", (qtime - now) if qtime else None,
        b"next-awake-within", (job.awakeme - now) if job.awakeme else None,
    ])
    if with_body:
        reply += [b"body", job.body]
    else:
        reply += [b"body-size", len(job.body)]
    ext = job.ext
    if ext is None:
        return reply
    # Only jobs made with the extension options show them, after the
    # original's fields (some clients read SHOW by position).
    if ext.has_delivery_options:
        reply += [
            b"backoff", ext.backoff,
            b"max-deliveries", ext.max_deliveries,
            b"dead-letter-queue", dead_letter_queue(job) if not ext.dead_from else job.queue,
            b"dead-lettered-from", ext.dead_from or None,
        ]
    if ext.priority:
        reply += [b"priority", ext.priority]
    if ext.headers:
        reply += [b"headers", list(ext.headers)]
    if ext.group is not None:
        reply += [b"group", ext.group]
    return reply


#: SHOW's one option (an extension): the job's fields without its body.
NOBODY = b"nobody"


@command("show", -2, "fast", keys=KEYS_JOBS)
def show(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """SHOW id [NOBODY]: everything about a job, or NULL.  NOBODY (an
    extension) puts ``body-size`` where ``body`` was; anything else after
    the ID is refused as the original refuses it (its arity is 2)."""
    with_body = len(argv) == 2
    if not with_body and (len(argv) != 3 or argv[2].lower() != NOBODY):
        raise CommandError("ERR wrong number of arguments for 'show' command")
    (job_id,) = parse_job_ids(argv[1:2])
    job = state.jobs.get(job_id)
    if job is None:
        return None
    return show_reply(job, state.clock.now_ms(), with_body)

