"""The command table.  Importing this package registers every command."""

from . import acl, admin, bulk, cluster, jobs, persistence, queues  # noqa: F401  (registration side effects)
from .registry import BLOCKED, COMMANDS, Command, CommandClient, CommandError, command, execute

__all__ = ["BLOCKED", "COMMANDS", "Command", "CommandClient", "CommandError", "command",
           "execute"]
