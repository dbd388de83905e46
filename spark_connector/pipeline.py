"""One pipelined round trip that keeps every reply it got, even when the link drops.

The client library's pipeline (``Client._execute_many``) re-sends the whole
pipeline when the connection drops mid-way, including the requests already
answered: replies read before the drop are thrown away. For ADDJOB that adds
a second copy of jobs the sink already got an ID for. The sink needs "these
were answered, those were not", so it runs its own round trip here, on the
client's connection (so node choice, AUTH, HELLO and failover stay the
client's).

This uses the client's private connection API (``_lock``, ``_connection``,
``_drop``, ``_table``): the client has no public call that reports a partial
pipeline. The change that would remove this module is described in
docs/SPARK_SINK.md ("Failover"): ``_execute_many`` keeping each reply as it is
read and re-sending only unanswered requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disque.client import _wire as w
from disque.client.sync import NETWORK_ERRORS
from disque.exceptions import ConnectionFailed, Leaving

if TYPE_CHECKING:
    from disque.client import Client
    from disque.client._wire import Request

__all__ = ["round_trip", "move_away"]


def round_trip(client: Client, reqs: list[Request]) -> tuple[list[Any], ConnectionFailed | None]:
    """Send ``reqs`` as one pipeline to the client's node.

    Returns the results of the requests answered, in order (a prefix of
    ``reqs``: the parsed reply or the error reply), and the error that cut
    the rest off (None when every request was answered). Unanswered
    requests may or may not have run on the node.
    """
    with client._lock:
        try:
            conn = client._connection()
        except ConnectionFailed as exc:
            return [], exc
        address = client.address or "?"
        replies: list[Any] = []
        error: ConnectionFailed | None = None
        try:
            conn.send_packed_command([w.pack_commands([r.args for r in reqs])])
            for req in reqs:
                replies.append(conn.read_response(timeout=client._read_timeout(req.wait)))
        except NETWORK_ERRORS as exc:
            client._drop()  # the next connect tries this node last
            error = ConnectionFailed(f"connection to {address} lost after {len(replies)} of "
                                     f"{len(reqs)} replies: {exc}", {address: exc})
        except BaseException:
            client._drop()  # replies pending: the connection is unusable
            raise
    results: list[Any] = [None] * len(replies)
    w.sort_replies(reqs, list(range(len(replies))), replies, results)
    return results, error


def move_away(client: Client) -> None:
    """The node said ``-LEAVING``: mark it so and connect elsewhere next time."""
    with client._lock:
        client._table.mark_leaving(client.node_id)
        client._drop()


def is_leaving(result: Any) -> bool:
    return isinstance(result, Leaving)
