"""In-process node state with a manual clock, for unit tests of the state machine.

Commands go through the real command table (``execute``); only the socket is
missing, so the "client" is the minimal object the table needs.
"""

from __future__ import annotations

from typing import Any

import hiredis

from disque.acl import User
from disque.clock import ManualClock
from disque.cluster import ClusterNode, ClusterState
from disque.commands import CommandClient, execute
from disque.config import Config
from disque.node_events import NodeEvents
from disque.protocol import Encoded, ReplyError, Status
from disque.state import ServerState
from disque.timers import process_due_jobs

NODE_ID = "a" * 40


class LocalClient(CommandClient):
    """A command client without a socket: its replies are kept in a list."""

    def __init__(self, user: User) -> None:
        super().__init__(user)
        self.replies: list[Any] = []
        self.local_ip = "127.0.0.1"
        self.id = 1

    def resume(self, reply: Any) -> None:
        self.replies.append(plain(reply))


def plain(reply: Any) -> Any:
    """A reply as a test reads it: the pre-encoded ones (Encoded, which the
    connection writes as they are) as what they stand for: ADDJOB's
    ``+<id>`` as a Status, GETJOB's entries as lists of bytes."""
    if type(reply) is Encoded:
        if reply.raw[:1] == b"+":
            return Status(reply.raw[1:-2].decode())
        reader = hiredis.Reader()
        reader.feed(reply.raw)
        return reader.gets()
    return reply


class Node:
    """A ServerState with a manual clock and helpers to run commands."""

    def __init__(self, **config: str) -> None:
        cfg = Config()
        for name, value in config.items():
            cfg.set(name.replace("_", "-"), value)
        self.clock = ManualClock()
        cluster = ClusterState(ClusterNode(NODE_ID, "127.0.0.1", 7711), None)
        self.state = ServerState(cfg, cluster, NodeEvents(), clock=self.clock)
        self.client = LocalClient(self.state.acl.default)

    def __call__(self, *args: Any) -> Any:
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        reply = execute(self.state, self.client, argv)
        if isinstance(reply, ReplyError):
            raise AssertionError(f"unexpected error reply: {reply.message}")
        return plain(reply)

    def error(self, *args: Any) -> str:
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        reply = execute(self.state, self.client, argv)
        assert isinstance(reply, ReplyError), f"expected an error, got {reply!r}"
        return reply.message

    def raw(self, *args: Any) -> Any:
        """The reply as the command table returned it (errors included)."""
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        return plain(execute(self.state, self.client, argv))

    def advance(self, ms: int) -> int:
        """Move time forward and run what became due; returns jobs processed."""
        self.clock.advance(ms)
        return process_due_jobs(self.state, self.clock.now_ms())

    def job(self, job_id: bytes):
        return self.state.jobs.get(job_id)
