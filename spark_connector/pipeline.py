"""One pipelined round trip that keeps every reply it got, even when the link drops.

The client library's pipeline (``Client._execute_many``) re-sends the whole
pipeline when the connection drops mid-way, including the requests already
answered: replies read before the drop are thrown away. For ADDJOB that adds
a second copy of jobs the sink already got an ID for. The sink needs "these
were answered, those were not", so it runs its own round trip here, on the
client's connection (so node choice, AUTH, HELLO and failover stay the
client's).  It also sends what the sink encoded itself from Arrow columns
(:mod:`.resp`), so no Python object per command is made.

This uses the client's private connection API (``_lock``, ``_connection``,
``_drop``, ``_table``): the client has no public call that reports a partial
pipeline. The change that would remove this module is described in
docs/SPARK_SINK.md ("Failover"): ``_execute_many`` keeping each reply as it is
read and re-sending only unanswered requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disque.client.sync import NETWORK_ERRORS
from disque.exceptions import ConnectionFailed, Leaving

if TYPE_CHECKING:
    from disque.client import Client

__all__ = ["exchange", "move_away"]


def exchange(client: Client, build: Callable[[str | None], tuple[bytes, int]],
             wait: float | None) -> tuple[list[Any], int, ConnectionFailed | None]:
    """Send one pipeline to the client's node and read its replies.

    ``build(node_id)`` is called once connected, since what to send may
    depend on the node (ADDJOBS or ADDJOBs): it returns the encoded
    pipeline and how many replies it asks for.  Returns the raw replies
    read, in order (error replies as :class:`DisqueError` values), the
    number asked for (0 when no node could be reached), and the error that
    cut the rest off (None when every reply was read).  Commands without a
    reply may or may not have run on the node.
    """
    with client._lock:
        try:
            conn = client._connection()
        except ConnectionFailed as exc:
            return [], 0, exc
        address = client.address or "?"
        payload, count = build(client.node_id)
        replies: list[Any] = []
        timeout = client._read_timeout(wait)
        try:
            conn.send_packed_command([payload])
            for _ in range(count):
                replies.append(conn.read_response(timeout=timeout))
        except NETWORK_ERRORS as exc:
            client._drop()  # the next connect tries this node last
            return replies, count, ConnectionFailed(
                f"connection to {address} lost after {len(replies)} of {count} replies: {exc}",
                {address: exc})
        except BaseException:
            client._drop()  # replies pending: the connection is unusable
            raise
    return replies, count, None


def move_away(client: Client) -> None:
    """The node said ``-LEAVING``: mark it so and connect elsewhere next time."""
    with client._lock:
        client._table.mark_leaving(client.node_id)
        client._drop()


def is_leaving(result: Any) -> bool:
    return isinstance(result, Leaving)
