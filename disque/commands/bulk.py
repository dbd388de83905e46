"""ADDJOBS: many jobs, one queue, shared options, in one command (an extension).

``ADDJOBS queue ms-timeout [ADDJOB options ...] BODIES body [body ...]``
``ADDJOBS queue ms-timeout [ADDJOB options ...] JOBS n [name value]*n body [n ...]``
``ADDJOBS queue ms-timeout [ADDJOB options ...] GROUPS group body [group body ...]``

The second form gives each job its own headers (disque/headers.py): per job
the number of its headers, that many names and values, then its body.  They
follow the HEADERs among the options, which every job gets; the limits
count both together.  The third gives each job its own group (GROUP,
disque/groups.py): a ``GROUP key`` among the options puts every job of the
other two forms in one group, in body order.

The original has no bulk form; a producer pipelines ADDJOBs.  One command
saves the node the per-command work (parsing, dispatch, one reply each) and
the client the per-command encoding, which is most of a small job's cost.

Each body is added exactly as ``ADDJOB queue body ms-timeout [options]``
would add it, by the ADDJOB handler itself, so every option, default and
rule (REPLICATE, DELAY, MAXLEN, external replication, ...) is ADDJOB's.
The reply is an array with one element per body, in order: the job's ID,
or the error ADDJOB would have given for that body alone (``-MAXLEN`` once
the queue is full, ``-OOM`` once memory is, ``-NOREPL`` for a job whose
copies timed out).  Errors that concern the command as a whole (syntax,
option values, too many bodies, ``-NOREPL`` for too few reachable nodes,
``-PAUSED``, ``-LEAVING``) are the reply, before any job is added.

In a cluster the jobs replicate together: their REPLJOBs leave in one bus
write (one REPLJOB per job: an original node drops a REPLJOB holding more
than one job) and the reply comes when every job is replicated or failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..acl import User
from ..eviction import free_memory_if_needed
from ..headers import limits_refusal, name_refusal
from ..job_options import group_refusal
from ..protocol import Encoded, ReplyError, Status
from ..waiters import NO_REPLY, Blocked, Waiter, park, unblock
from .jobs import GROUP_DELAY, AddJobOptions, addjob, parse_addjob
from .registry import (
    BLOCKED,
    KEYS_QUEUE,
    OOM,
    CommandClient,
    CommandError,
    OptionName,
    command,
    is_option,
    parse_int,
)

if TYPE_CHECKING:
    from ..state import ServerState

__all__ = ["MAX_BODIES", "addjobs"]

#: Bodies per ADDJOBS.  One command runs to completion before the node
#: serves anybody else: 10,000 small jobs take ~0.1 s here.
MAX_BODIES: Final = 10_000

_BODIES: Final = OptionName(b"bodies")
_JOBS: Final = OptionName(b"jobs")
_GROUPS: Final = OptionName(b"groups")
_HEADER: Final = b"HEADER"
_GROUP: Final = b"GROUP"
_NEEDS_BODIES: Final = ("ERR syntax error: ADDJOBS needs BODIES followed by at least one body, "
                        "or JOBS followed by at least one job, or GROUPS followed by at least "
                        "one group and its body")
#: The forms after the options: BODIES (bodies only), JOBS (each job's
#: headers), GROUPS (each job's group).
_FORM_BODIES: Final = 0
_FORM_JOBS: Final = 1
_FORM_GROUPS: Final = 2
#: Errors that depend only on the command and the node, not on which body:
#: the first body shows them, and they refuse the whole command.
_WHOLE_COMMAND_ERRORS: Final = ("NOREPL Not enough reachable nodes", "PAUSED", "LEAVING", "ERR")


class _Member(CommandClient):
    """The stand-in client of one body's ADDJOB while its copies are made:
    its reply lands in the batch's reply instead of a connection."""

    def __init__(self, batch: BlockedBatch, index: int, user: User | None) -> None:
        # The user of the ADDJOBS: ADDJOB checks a DEADLETTER queue against it.
        super().__init__(user, "addjobs")
        self.batch = batch
        self.index = index

    def resume(self, reply: Any) -> None:
        self.batch.member_done(self.index, reply)


class BlockedBatch(Blocked):
    """An ADDJOBS whose jobs wait for their copies.

    Each waiting job is parked on its own :class:`_Member` with ADDJOB's
    replication timeout; the client is released when the last one answers.
    """

    __slots__ = ("members", "parked", "remaining", "replies", "state")

    def __init__(self, state: ServerState, client: Waiter, size: int) -> None:
        super().__init__(client)
        self.state = state
        self.replies: list[Any] = [None] * size
        self.members: list[_Member] = []
        self.remaining = 0
        #: The client waits (set once every body was tried): a job answered
        #: before that only fills its place.
        self.parked = False

    def member_done(self, index: int, reply: Any) -> None:
        self.replies[index] = _element(reply)
        self.remaining -= 1
        if self.remaining == 0 and self.parked:
            unblock(self.state, self, self.replies)

    def overlappable(self) -> bool:
        # ADDJOBs and ADDJOBS pipelined after this one may run meanwhile,
        # as after a replicating ADDJOB.
        return True

    def release(self, state: ServerState) -> None:
        """Nothing of the batch itself to release: each job releases its own wait."""

    def timeout_reply(self, state: ServerState) -> Any:
        return self.replies  # never called: the batch has no timer of its own

    def abandoned(self, state: ServerState) -> None:
        """The client went away: every job still waiting drops its partial
        copies, as a lone ADDJOB's would."""
        for member in self.members:
            if member.blocked is not None:
                unblock(state, member.blocked, NO_REPLY)


def _element(reply: Any) -> Any:
    """ADDJOB's reply as an array element: the ID as a bulk string."""
    if type(reply) is Encoded:  # +<id>\r\n
        return reply.raw[1:-2]
    if isinstance(reply, Status):
        return reply.encode()
    return reply


#: ADDJOB's options and how many values each takes (the others take none):
#: an option's value is never taken for BODIES, JOBS or GROUPS (a
#: DEADLETTER queue or a GROUP key may be named so).
_OPTION_VALUES: Final = {
    b"replicate": 1, b"delay": 1, b"retry": 1, b"ttl": 1, b"maxlen": 1, b"backoff": 1,
    b"maxdeliveries": 1, b"deadletter": 1, b"priority": 1, b"idmp": 1, b"idmp-window": 1,
    b"group": 1, b"header": 2,
}


def _split(argv: list[bytes]) -> tuple[list[bytes], list[bytes], int]:
    """``ADDJOBS queue timeout opts... BODIES b...`` -> (the options, the
    bodies, _FORM_BODIES); with ``JOBS`` or ``GROUPS`` instead of
    ``BODIES``: (the options, the jobs' arguments, _FORM_JOBS or _FORM_GROUPS).

    Every argument after the first BODIES (JOBS, GROUPS) where an option's
    name would be is a body (or a job's part), whatever it says; in ``DELAY
    bodies x`` "bodies" is DELAY's value, and no BODIES follows.
    """
    i, n = 3, len(argv)
    while i < n:
        arg = argv[i]
        if is_option(arg, _BODIES):
            return argv[3:i], argv[i + 1:], _FORM_BODIES
        if is_option(arg, _JOBS):
            return argv[3:i], argv[i + 1:], _FORM_JOBS
        if is_option(arg, _GROUPS):
            return argv[3:i], argv[i + 1:], _FORM_GROUPS
        i += 1 + _OPTION_VALUES.get(arg.lower(), 0)
    raise CommandError(_NEEDS_BODIES)


def _jobs_with_headers(state: ServerState, args: list[bytes],
                       shared: list[bytes] | None) -> tuple[list[bytes], list[list[bytes]]]:
    """JOBS' arguments -> the bodies and, per body, the ``HEADER name value``
    arguments its ADDJOB gets, every job checked (names, limits with the
    ``shared`` headers of the options) before any is added."""
    config = state.config
    max_count: int = config.max_job_headers
    max_size: int = config.max_job_headers_size
    shared_items = shared or []
    bodies: list[bytes] = []
    extra: list[list[bytes]] = []
    i, n = 0, len(args)
    while i < n:
        count = parse_int(args[i], "ERR JOBS: a job's header count must be a number >= 0", 0,
                          max_count, f"ERR too many headers: at most {max_count} per job "
                          "(max-job-headers)")
        end = i + 1 + 2 * count
        if end >= n:
            raise CommandError("ERR syntax error: JOBS needs, per job, its header count, its "
                               "headers (name value ...) and its body")
        items = args[i + 1:end]
        for name in items[::2]:
            refused = name_refusal(name)
            if refused is not None:
                raise CommandError(refused)
        refused = limits_refusal([*shared_items, *items], max_count, max_size)
        if refused is not None:
            raise CommandError(refused)
        options: list[bytes] = []
        for k in range(0, len(items), 2):
            options.append(_HEADER)
            options.append(items[k])
            options.append(items[k + 1])
        extra.append(options)
        bodies.append(args[end])
        i = end + 1
        if len(bodies) > MAX_BODIES:
            break  # refused by the caller: no need to read the rest
    return bodies, extra


def _jobs_with_groups(state: ServerState, args: list[bytes],
                      shared: AddJobOptions) -> tuple[list[bytes], list[list[bytes]]]:
    """GROUPS' arguments (group, body, ...) -> the bodies and, per body, the
    ``GROUP key`` arguments its ADDJOB gets, every key checked before any
    job is added."""
    if shared.group is not None:
        raise CommandError("ERR GROUPS gives each job its group: no GROUP option with it")
    if shared.delay:
        raise CommandError(GROUP_DELAY)
    if len(args) % 2:
        raise CommandError("ERR syntax error: GROUPS needs, per job, its group and its body")
    max_len: int = state.config.max_group_key_len
    bodies: list[bytes] = []
    extra: list[list[bytes]] = []
    for i in range(0, min(len(args), 2 * (MAX_BODIES + 1)), 2):
        key = args[i]
        refused = group_refusal(key, max_len)
        if refused is not None:
            raise CommandError(refused)
        extra.append([_GROUP, key])
        bodies.append(args[i + 1])
    return bodies, extra


@command("addjobs", -5, "write denyoom", keys=KEYS_QUEUE)
def addjobs(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """ADDJOBS queue ms-timeout [ADDJOB's options] BODIES body [body ...]
    ADDJOBS queue ms-timeout [ADDJOB's options] JOBS n [name value]*n body [n ...]
    ADDJOBS queue ms-timeout [ADDJOB's options] GROUPS group body [group body ...]"""
    options, bodies, form = _split(argv)
    if not bodies:
        raise CommandError(_NEEDS_BODIES)
    queue, timeout = argv[1], argv[2]
    head = [b"addjob", queue]
    tail = [timeout, *options]
    shared = parse_addjob([*head, b"", *tail])  # option errors refuse it all
    if shared.idmp is not None:
        raise CommandError("ERR IDMP names one job: use ADDJOB for idempotent adds")
    if shared.group is not None:
        refused = group_refusal(shared.group, state.config.max_group_key_len)
        if refused is not None:
            raise CommandError(refused)
    extra: list[list[bytes]] | None = None
    if form == _FORM_JOBS:
        bodies, extra = _jobs_with_headers(state, bodies, shared.headers)
    elif form == _FORM_GROUPS:
        bodies, extra = _jobs_with_groups(state, bodies, shared)
    if len(bodies) > MAX_BODIES:
        raise CommandError(f"ERR too many bodies: ADDJOBS takes at most {MAX_BODIES}")

    batch = BlockedBatch(state, client, len(bodies))
    replies = batch.replies
    memory = state.memory
    argv = [*head, b"", *tail]
    member = _Member(batch, 0, client.user)
    for index, body in enumerate(bodies):
        if index and memory.level() >= 2 and free_memory_if_needed(state) >= 3:
            replies[index] = OOM
            continue
        argv[2] = body  # ADDJOB keeps the body, never the argument list
        member.index = index
        reply = addjob(state, member, argv if extra is None else [*argv, *extra[index]])
        if reply is BLOCKED:
            batch.members.append(member)
            batch.remaining += 1
            # That one waits: the next needs its own.
            member = _Member(batch, index + 1, client.user)
            continue
        if index == 0 and isinstance(reply, ReplyError) and \
                reply.message.startswith(_WHOLE_COMMAND_ERRORS):
            return reply
        replies[index] = _element(reply)
    if batch.remaining == 0:
        return replies
    batch.parked = True
    park(state, batch, 0)  # no timer: each job times out on its own
    return BLOCKED
