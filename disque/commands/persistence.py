"""Persistence commands: BGREWRITEAOF, and LOADJOB (the AOF's record, not for clients).

The AOF is a list of ``LOADJOB``/``DELJOB`` commands (see ``disque/aof/``),
replayed at start-up by the loader, which applies them directly to a job
table.  ``LOADJOB`` therefore exists as a command name only so that a client
sending it gets a clear refusal, like the original where it is reserved for
the AOF loading client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol import Status
from .registry import CommandError, command

if TYPE_CHECKING:
    from ..connection import ClientConnection
    from ..state import ServerState


@command("loadjob", 2, "admin")
def loadjob(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """LOADJOB <serialized job>: only the AOF loader may use it."""
    raise CommandError("ERR LOADJOB is reserved for loading the append only file and can't "
                       "be called by clients")


@command("bgrewriteaof", 1, "admin")
def bgrewriteaof(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """BGREWRITEAOF: compact the AOF while the node keeps serving."""
    aof = state.persistence
    if aof is None:
        raise CommandError("ERR append only file support is not available")
    if aof.rewriting:
        raise CommandError("ERR Background append only file rewriting already in progress")
    if not aof.start_rewrite("BGREWRITEAOF"):
        raise CommandError("ERR Can't start the background append only file rewrite: "
                           "see the log")
    return Status("Background append only file rewriting started")
