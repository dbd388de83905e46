"""The command table and the checks every command goes through.

Each command is declared once with :func:`command`: its name, its arity
(``N`` exactly N arguments including the name, ``-N`` at least N), its
flags, and for the users' permissions (``acl.py``) where it names queues
and its categories beyond those its flags give.  :func:`execute` does, in
this order, what processCommand does in the original: unknown command,
arity, authentication, then the user's permissions (an extension), memory.
Handlers then only parse their own options and act; they raise
:class:`CommandError` for an error reply.

Flags:
  ``write``    changes jobs or queues
  ``denyoom``  may use more memory: refused with -OOM at the memory limit
  ``noauth``   allowed before AUTH (and, but for CLIENT, whatever the user)
  ``admin``    administrative
  ``fast``     O(1)-ish, never blocks

ACL categories, as Redis names them: ``admin`` and ``dangerous`` for admin
commands, ``write`` for write commands, ``read`` for the rest unless a
command is declared ``connection`` or ``dangerous``; ``fast`` or ``slow``;
plus what a command declares (``blocking``, ``keyspace``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..acl import User
from ..compiled import mypyc_attr
from ..eviction import free_memory_if_needed
from ..job import are_valid_job_ids, is_valid_job_id
from ..protocol import ReplyError
from ..waiters import Waiter

if TYPE_CHECKING:
    from ..state import ServerState

__all__ = [
    "CommandClient",
    "NativeHandler",
    "Command", "CommandError", "COMMANDS", "command", "execute", "BLOCKED",
    "FROM", "OptionName", "is_option",
    "parse_int", "parse_job_ids", "parse_timeout_ms", "range_error", "SYNTAX_ERROR",
    "INT_ERROR", "KEYS_NONE", "KEYS_QUEUE", "KEYS_FROM", "KEYS_JOBS", "acl_catalog",
    "queue_refusal", "queue_name_refusal", "queues_refusal",
]

log: Final = logging.getLogger("disque.commands")


@mypyc_attr(allow_interpreted_subclasses=True)
class CommandClient(Waiter):
    """What the command table and the job commands use of the client that
    sent a command: the connection (``ClientConnection``), or a stand-in
    that runs a command without one (each body of an ADDJOBS, the tests'
    in-process node).  A base class rather than a Protocol: compiled, its
    fields are then read natively (a Protocol made each read a Python-level
    attribute lookup, several per command)."""

    def __init__(self, user: User | None, last_command: str = "NULL") -> None:
        super().__init__()
        #: The user the client authenticated as; None before AUTH (when
        #: ``default`` needs a password).
        self.user = user
        #: The last command it ran (CLIENT LIST's ``cmd``).
        self.last_command = last_command
        #: HELLO 3 switched it to RESP3.
        self.resp3 = False


#: Handlers of commands outside the job core take the real ClientConnection.
Handler = Callable[["ServerState", Any, list[bytes]], Any]


class NativeHandler:
    """A command's handler as a method of a compiled class, for the commands
    every workload runs (ADDJOB, GETJOB): compiled, :func:`execute` calls
    it in C, where a handler function is called through its Python object,
    whose wrapper parses the arguments again (~190 instructions a command).
    A subclass's ``run`` calls the command's function, which must not be
    decorated (compiled, a decorated function is called as a Python object
    too): it is declared with ``command(...)(function)``.
    """

    def run(self, state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
        raise NotImplementedError

#: Returned by a handler that parked the client; the reply comes later.
BLOCKED: Final = object()

SYNTAX_ERROR: Final = "ERR syntax error"
INT_ERROR: Final = "ERR value is not an integer or out of range"
BADID: Final = "BADID Invalid Job ID format."
NOAUTH: Final = ReplyError("NOAUTH Authentication required.")
OOM: Final = ReplyError("OOM command not allowed when used memory > 'maxmemory'.")

# 64-bit signed range, like getLongLongFromObject.
INT64_MIN: Final = -(2 ** 63)
INT64_MAX: Final = 2 ** 63 - 1


class CommandError(Exception):
    """Raised by handlers: the message becomes a ``-...`` error reply."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


#: Where a command names the queues it touches, for the users' ``~patterns``.
KEYS_NONE: Final = 0
#: The first argument is a queue (ADDJOB, QLEN, PAUSE ...).
KEYS_QUEUE: Final = 1
#: The arguments after FROM are queues (GETJOB).
KEYS_FROM: Final = 2
#: The job IDs among the arguments: their jobs' queues (ACKJOB, SHOW ...).
KEYS_JOBS: Final = 3


class Command:
    """One entry of the command table.  A plain class, not a dataclass: the
    compiled core then reads its fields natively on every command (a frozen
    dataclass's were generic attribute lookups, ~2k instructions a command)."""

    __slots__ = ("acl_exempt", "arity", "categories", "denyoom", "flags", "free_subcommands",
                 "handler", "keys", "name", "native", "noauth", "write")

    def __init__(self, name: str, handler: Handler, arity: int, flags: frozenset[str],
                 write: bool = False, denyoom: bool = False, noauth: bool = False,
                 keys: int = KEYS_NONE, categories: frozenset[str] = frozenset(),
                 free_subcommands: frozenset[bytes] = frozenset(),
                 native: NativeHandler | None = None) -> None:
        self.name = name
        self.handler = handler
        #: The same handler, called in C (NativeHandler); None for most commands.
        self.native = native
        self.arity = arity
        self.flags = flags
        # The flags execute() tests on every command, as plain booleans.
        self.write = write
        self.denyoom = denyoom
        self.noauth = noauth
        #: Where the command names queues (KEYS_*).
        self.keys = keys
        #: Its ACL categories (without the ``@``).
        self.categories = categories
        #: Subcommands any authenticated user may run (CLIENT SETNAME, ACL WHOAMI ...).
        self.free_subcommands = free_subcommands
        #: Run whatever the user's permissions (AUTH, HELLO, PING, QUIT: as
        #: Redis's no-auth commands).
        self.acl_exempt = noauth and not free_subcommands

    def __repr__(self) -> str:
        return f"Command({self.name!r}, arity={self.arity}, flags={sorted(self.flags)})"

    def arity_ok(self, argc: int) -> bool:
        return argc == self.arity if self.arity >= 0 else argc >= -self.arity


COMMANDS: Final[dict[bytes, Command]] = {}


def command(name: str, arity: int, flags: str = "", *, keys: int = KEYS_NONE,
            categories: str = "", free_subcommands: str = "",
            native: NativeHandler | None = None) -> Callable[[Handler], Handler]:
    """Declare a command: ``@command("qlen", 2, "fast", keys=KEYS_QUEUE)``;
    ``native``: the same handler as a :class:`NativeHandler`."""
    def register(handler: Handler) -> Handler:
        names = frozenset(flags.split())
        cmd = Command(name, handler, arity, names, "write" in names, "denyoom" in names,
                      "noauth" in names, keys, _categories(names, categories),
                      frozenset(sub.encode() for sub in free_subcommands.split()), native)
        COMMANDS[name.encode()] = cmd
        COMMANDS[name.upper().encode()] = cmd
        _CATALOG.clear()
        _LAST.name = b""
        _LAST.command = None
        return handler
    return register


def _categories(flags: frozenset[str], declared: str) -> frozenset[str]:
    found = set(declared.split())
    if "admin" in flags:
        found |= {"admin", "dangerous"}
    elif "write" in flags:
        found.add("write")
    elif not found & {"connection", "dangerous"}:
        found.add("read")
    found.add("fast" if "fast" in flags else "slow")
    return frozenset(found)


_CATALOG: Final[dict[str, frozenset[str]]] = {}


def acl_catalog() -> dict[str, frozenset[str]]:
    """ACL category -> the names of its commands, and ``"all"`` -> every name."""
    if not _CATALOG:
        everything = {cmd.name: cmd for cmd in COMMANDS.values()}
        found: dict[str, set[str]] = {}
        for cmd in everything.values():
            for category in cmd.categories:
                found.setdefault(category, set()).add(cmd.name)
        _CATALOG.update({category: frozenset(names) for category, names in found.items()})
        _CATALOG["all"] = frozenset(everything)
    return _CATALOG


class _LastLookup:
    """The last name :func:`lookup` found and its command."""

    __slots__ = ("command", "name")

    def __init__(self) -> None:
        self.name = b""
        self.command: Command | None = None


#: A connection, a pipeline, most workloads send one command over and over:
#: comparing the name with the last one costs less than hashing it for the
#: table (names arrive as new bytes objects, their hash not yet computed).
#: Forgotten whenever a command is declared.
_LAST: Final = _LastLookup()


def lookup(name: bytes) -> Command | None:
    """The command called ``name``, in any letter case."""
    last = _LAST
    if name == last.name:
        return last.command
    cmd = COMMANDS.get(name)
    if cmd is None:
        cmd = COMMANDS.get(name.lower())
        if cmd is None:
            return None
    last.name = name
    last.command = cmd
    return cmd


def execute(state: ServerState, client: CommandClient, argv: list[bytes]) -> Any:
    """Run one command and return its reply (or ``BLOCKED``)."""
    cmd = lookup(argv[0])
    if cmd is None:
        name = argv[0][:128].decode("utf-8", "replace")
        return ReplyError(f"ERR unknown command '{name}'")
    client.last_command = cmd.name
    if not cmd.arity_ok(len(argv)):
        return ReplyError(f"ERR wrong number of arguments for '{cmd.name}' command")
    user = client.user
    if user is None and not cmd.noauth:
        return NOAUTH
    if cmd.keys == KEYS_QUEUE and len(argv[1]) > state.max_queue_name_len:
        return queue_name_refusal(state, argv[1])
    if user is not None and not user.unrestricted and not cmd.acl_exempt:
        refused = _acl_refusal(state, user, cmd, argv)
        if refused is not None:
            return refused
    if cmd.denyoom and state.memory.level() >= 2 and free_memory_if_needed(state) >= 3:
        return OOM
    aof = state.logging_persistence if cmd.write else None
    if aof is not None and (refused := aof.refuse_write()) is not None:
        return refused  # -MISCONF while the AOF cannot be written
    state.stats.commands_processed += 1
    native = cmd.native
    try:
        if native is not None:
            reply = native.run(state, client, argv)
        else:
            reply = cmd.handler(state, client, argv)
    except CommandError as err:
        reply = ReplyError(err.message)
    except Exception as err:  # a bug: answer it, keep the connection and the node
        log.exception("Internal error running %r", cmd.name)
        reply = ReplyError(f"ERR internal error running '{cmd.name}': "
                           f"{type(err).__name__}: {err}")
    # The command's AOF records are written before it may answer.
    return reply if aof is None else aof.after_command(reply)


# --------------------------------------------------------------------------
# Users' permissions (an extension: acl.py, docs/EXTENSIONS.md)
# --------------------------------------------------------------------------

def _acl_refusal(state: ServerState, user: User, cmd: Command,
                 argv: list[bytes]) -> ReplyError | None:
    """-NOPERM if ``user`` may not run ``cmd`` or touch a queue it names."""
    if not user.may_run(cmd.name) and not (len(argv) > 1 and cmd.free_subcommands
                                           and argv[1].lower() in cmd.free_subcommands):
        state.acl.denied(user.name, "command")
        return ReplyError(f"NOPERM User {user.name} has no permissions to run the "
                          f"'{cmd.name}' command")
    keys = cmd.keys
    if user.all_queues or keys == KEYS_NONE:
        return None
    if keys == KEYS_QUEUE:
        return queue_refusal(state, user, argv[1])
    if keys == KEYS_FROM:
        for i in range(1, len(argv)):
            arg = argv[i]
            if is_option(arg, FROM):
                refused = queues_refusal(state, argv[i + 1:])  # before any matching
                if refused is not None:
                    return refused
                for name in argv[i + 1:]:
                    refused = queue_refusal(state, user, name)
                    if refused is not None:
                        return refused
                break
        return None
    for arg in argv[1:]:  # KEYS_JOBS
        if len(arg) == 40 and is_valid_job_id(arg):
            job = state.jobs.get(arg)
            if job is not None and job.queue is not None and not user.may_access(job.queue):
                state.acl.denied(user.name, "queue")
                return ReplyError(f"NOPERM User {user.name} has no permissions to access "
                                  f"the queue of job {arg.decode()}")
    return None


def queue_refusal(state: ServerState, user: User, queue: bytes) -> ReplyError | None:
    """-NOPERM if no pattern of ``user`` matches ``queue`` (counted); a name
    over max-queue-name-len is refused before any pattern is tried."""
    if len(queue) > state.max_queue_name_len:
        return queue_name_refusal(state, queue)
    if user.may_access(queue):
        return None
    state.acl.denied(user.name, "queue")
    name = queue[:128].decode("utf-8", "replace")
    return ReplyError(f"NOPERM User {user.name} has no permissions to access the "
                      f"'{name}' queue")


# --------------------------------------------------------------------------
# Limits on the queues a command names (max-queue-name-len, max-queues-per-command)
# --------------------------------------------------------------------------

def queue_name_refusal(state: ServerState, queue: bytes) -> ReplyError:
    """The error for a queue name over ``max-queue-name-len``."""
    state.stats.refused_queue_names += 1
    return ReplyError(f"ERR queue name too long: {len(queue)} bytes, the limit is "
                      f"{state.max_queue_name_len} (max-queue-name-len)")


def queues_refusal(state: ServerState, queues: list[bytes]) -> ReplyError | None:
    """The error for too many queues, or one too long a name, among ``queues``."""
    if len(queues) > state.max_queues_per_command:
        state.stats.refused_queue_names += 1
        return ReplyError(f"ERR too many queues: {len(queues)}, the limit is "
                          f"{state.max_queues_per_command} (max-queues-per-command)")
    limit = state.max_queue_name_len
    for name in queues:
        if len(name) > limit:
            return queue_name_refusal(state, name)
    return None


# --------------------------------------------------------------------------
# Argument helpers
# --------------------------------------------------------------------------

class OptionName:
    """A command's keyword (an option, or a command's own name) in both
    letter cases, for :func:`is_option`."""

    __slots__ = ("lower", "size", "upper")

    def __init__(self, lower: bytes) -> None:
        self.lower = lower
        self.upper = lower.upper()
        self.size = len(lower)


def is_option(arg: bytes, option: OptionName) -> bool:
    """Whether ``arg`` is ``option``, in any letter case.

    A word of another length is not, without a comparison (a command's
    parser tries its options in turn: GETJOB's NOHANG is tried as FROM,
    COUNT and TIMEOUT first).  Clients write an option all in capitals or
    all in lower case: two comparisons decide, and only a mixed-case word
    pays for ``lower()`` (a new bytes object per argument and option tried,
    as Python code in the compiled core).
    """
    if len(arg) != option.size:
        return False
    return arg == option.upper or arg == option.lower or arg.lower() == option.lower


#: GETJOB's FROM: the queues follow it (also read by the users' permissions).
FROM: Final = OptionName(b"from")


def parse_int(raw: bytes, error: str = INT_ERROR, low: int = INT64_MIN,
              high: int = INT64_MAX, too_big: str | None = None) -> int:
    """A strict decimal integer in [low, high] (no spaces, no '+', no floats).

    ``error`` answers what is not a number and, like the original's messages
    ("TTL must be a number > 0"), a number below ``low``. A well-formed
    number above ``high`` answers ``too_big``, by default ``error`` plus the
    upper bound; with the generic ``INT_ERROR`` any number out of range gets
    the range (a caller with its own generic text and no bounds keeps it).
    The original answered its generic text for numbers beyond 64 bits, which
    left a user who typed a valid-looking number guessing.
    """
    size = len(raw)
    start = 1 if size and raw[0] == 45 else 0  # b"-"
    negative = start == 1
    ndigits = size - start
    if ndigits == 0 or (raw[start] == 48 and (negative or ndigits > 1)):
        raise CommandError(error)  # like string2ll: no leading zeros (nor "-0")
    value = 0
    if ndigits <= 18:
        # Digit by digit: compiled, a few instructions each, where int() of
        # bytes is a Python-level call costing more than the rest of the
        # parse (ADDJOB's options, COUNT, timeouts: every number of a request).
        for i in range(start, size):
            digit = raw[i] - 48
            if digit < 0 or digit > 9:
                raise CommandError(error)  # no '+', no spaces, no signs inside
            value = value * 10 + digit
        if negative:
            value = -value
    elif not raw[start:].isdigit():
        raise CommandError(error)
    else:
        # More than 19 digits is beyond 64 bits: no need to convert it (and
        # Python refuses int() of very long strings).
        value = int(raw) if ndigits <= 19 else (INT64_MIN - 1 if negative else INT64_MAX + 1)
    if low <= value <= high:
        return value
    if value < low and low > INT64_MIN and error != INT_ERROR:
        raise CommandError(error)  # the caller's text states the lower bound
    if value > high and too_big is not None:
        raise CommandError(too_big)
    if error == INT_ERROR:
        raise CommandError(range_error(low, high))
    if low > INT64_MIN:
        raise CommandError(f"{error} and at most {high}")
    raise CommandError(error)  # a caller's own generic text, e.g. "... or out of range"


def range_error(low: int, high: int) -> str:
    """The error for a well-formed number out of a command's range."""
    return f"ERR value is out of range, must be between {low} and {high}"


#: getTimeoutFromObjectOrReply's text, for what is not a number.
TIMEOUT_ERROR: Final = "ERR timeout is not an integer or out of range"


def parse_timeout_ms(raw: bytes) -> int:
    """A command timeout in milliseconds (getTimeoutFromObjectOrReply)."""
    if raw[:1] == b"-" and raw[1:].isdigit() and raw[1:2] != b"0":
        raise CommandError("ERR timeout is negative")
    return parse_int(raw, TIMEOUT_ERROR, 0, too_big=_TIMEOUT_TOO_BIG)


# Built once, not per call (see parse_timeout_ms).
_TIMEOUT_TOO_BIG: Final = (f"ERR timeout is out of range, must be between 0 and {INT64_MAX} "
                           "(milliseconds)")


def parse_job_ids(ids: list[bytes]) -> list[bytes]:
    """Validate every ID before acting on any (the original's validateJobIDs)."""
    if not are_valid_job_ids(ids):
        raise CommandError(BADID)
    return ids

