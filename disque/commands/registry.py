"""The command table and the checks every command goes through.

Each command is declared once with :func:`command`: its name, its arity
(``N`` exactly N arguments including the name, ``-N`` at least N) and its
flags.  :func:`execute` does, in this order, what processCommand does in the
original: unknown command, arity, authentication, memory.  Handlers then
only parse their own options and act; they raise :class:`CommandError` for
an error reply.

Flags:
  ``write``    changes jobs or queues
  ``denyoom``  may use more memory: refused with -OOM at the memory limit
  ``noauth``   allowed before AUTH
  ``admin``    administrative
  ``fast``     O(1)-ish, never blocks
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..job import are_valid_job_ids
from ..memory import free_memory_if_needed
from ..protocol import ReplyError

if TYPE_CHECKING:
    from ..connection import ClientConnection
    from ..state import ServerState

__all__ = [
    "Command", "CommandError", "COMMANDS", "command", "execute", "BLOCKED",
    "parse_int", "parse_job_ids", "SYNTAX_ERROR", "INT_ERROR",
]

log = logging.getLogger("disque.commands")

Handler = Callable[["ServerState", "ClientConnection", list[bytes]], Any]

#: Returned by a handler that parked the client; the reply comes later.
BLOCKED = object()

SYNTAX_ERROR = "ERR syntax error"
INT_ERROR = "ERR value is not an integer or out of range"
BADID = "BADID Invalid Job ID format."
NOAUTH = ReplyError("NOAUTH Authentication required.")
OOM = ReplyError("OOM command not allowed when used memory > 'maxmemory'.")

# 64-bit signed range, like getLongLongFromObject.
INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1


class CommandError(Exception):
    """Raised by handlers: the message becomes a ``-...`` error reply."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    handler: Handler
    arity: int
    flags: frozenset[str]
    # The flags execute() tests on every command, as plain booleans.
    write: bool = False
    denyoom: bool = False
    noauth: bool = False

    def arity_ok(self, argc: int) -> bool:
        return argc == self.arity if self.arity >= 0 else argc >= -self.arity


COMMANDS: dict[bytes, Command] = {}


def command(name: str, arity: int, flags: str = "") -> Callable[[Handler], Handler]:
    """Declare a command: ``@command("addjob", -4, "write denyoom")``."""
    def register(handler: Handler) -> Handler:
        names = frozenset(flags.split())
        cmd = Command(name, handler, arity, names, "write" in names, "denyoom" in names,
                      "noauth" in names)
        COMMANDS[name.encode()] = cmd
        COMMANDS[name.upper().encode()] = cmd
        return handler
    return register


def lookup(name: bytes) -> Command | None:
    """The command called ``name``, in any letter case."""
    cmd = COMMANDS.get(name)
    if cmd is None:
        cmd = COMMANDS.get(name.lower())
    return cmd


def execute(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """Run one command and return its reply (or ``BLOCKED``)."""
    cmd = COMMANDS.get(argv[0]) or lookup(argv[0])
    if cmd is None:
        name = argv[0][:128].decode("utf-8", "replace")
        return ReplyError(f"ERR unknown command '{name}'")
    client.last_command = cmd.name
    if not cmd.arity_ok(len(argv)):
        return ReplyError(f"ERR wrong number of arguments for '{cmd.name}' command")
    if not client.authenticated and not cmd.noauth:
        return NOAUTH
    if cmd.denyoom and state.memory.level() >= 2 and free_memory_if_needed(state) >= 3:
        return OOM
    aof = state.aof if cmd.write else None
    if aof is not None and (refused := aof.refuse_write()) is not None:
        return refused  # -MISCONF while the AOF cannot be written
    state.stats.commands_processed += 1
    try:
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
# Argument helpers
# --------------------------------------------------------------------------

def parse_int(raw: bytes, error: str = INT_ERROR, low: int = INT64_MIN,
              high: int = INT64_MAX) -> int:
    """A strict decimal integer in [low, high] (no spaces, no '+', no floats)."""
    if not raw or len(raw) > 20 or not (raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit())):
        raise CommandError(error)
    if len(raw) > 1 and (raw[:1] == b"0" or raw[:2] == b"-0"):
        raise CommandError(error)  # like string2ll: no leading zeros
    value = int(raw)
    if not low <= value <= high:
        raise CommandError(error)
    return value


def parse_timeout_ms(raw: bytes) -> int:
    """A command timeout in milliseconds (getTimeoutFromObjectOrReply)."""
    value = parse_int(raw, "ERR timeout is not an integer or out of range")
    if value < 0:
        raise CommandError("ERR timeout is negative")
    return value


def parse_job_ids(ids: list[bytes]) -> list[bytes]:
    """Validate every ID before acting on any (the original's validateJobIDs)."""
    if not are_valid_job_ids(ids):
        raise CommandError(BADID)
    return ids

