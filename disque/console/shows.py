"""Jobs' fields without their bodies: ``SHOW id NOBODY`` where a node has it.

The console reads jobs for their state, times and counters far more often
than for their bodies: the job lists of a queue, the age of a queue's next
job, the live updates of a job page, where a task's claims stand.  This
server's nodes answer ``SHOW id NOBODY`` with SHOW's fields and
``body-size`` in place of ``body`` (docs/EXTENSIONS.md); an original node
answers it with SHOW's arity error, and then gets plain SHOW (its bodies
read, as before).  Which node has it is learnt from its first answer and
kept on the :class:`~disque.console.nodes.Pool`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from disque.client import AsyncClient, DisqueError, PipelineReplies

from .nodes import Node, Pool
from .replies import encode, number

__all__ = ["refuses_nobody", "show_pipeline", "show_one", "body_size"]

#: How a node without the extension answers ``SHOW id NOBODY``.
ARITY_ERROR = "wrong number of arguments for 'show' command"


def refuses_nobody(reply: Any) -> bool:
    """Whether ``reply`` is the arity error of a node without ``NOBODY``."""
    return isinstance(reply, DisqueError) and ARITY_ERROR in str(reply)


def _nobody(pool: Pool, node: Node, body: bool) -> bool:
    return not body and pool.show_nobody.get(node.address) is not False


def show_pipeline(pool: Pool, node: Node, ids: Sequence[str], body: bool = False,
                  wait: float = 0.0) -> Callable[[AsyncClient], Awaitable[PipelineReplies]]:
    """SHOW of each of ``ids`` on ``node``, pipelined (a call for
    :meth:`Pool.on`): the raw replies, in order.  Without ``body``, ``SHOW
    id NOBODY`` where the node has it; the fields then hold ``body-size``
    and no ``body``."""
    async def send(client: AsyncClient, nobody: bool) -> PipelineReplies:
        tail = ("NOBODY",) if nobody else ()
        payload, count = encode(("SHOW", i, *tail) for i in ids), len(ids)
        return await client.send_pipeline(lambda _node: (payload, count), wait=wait)

    async def call(client: AsyncClient) -> PipelineReplies:
        nobody = _nobody(pool, node, body)
        result = await send(client, nobody)
        if nobody and result.replies:
            if refuses_nobody(result.replies[0]):
                pool.show_nobody[node.address] = False
                return await send(client, False)
            pool.show_nobody[node.address] = True
        return result
    return call


def show_one(pool: Pool, node: Node, job_id: str, body: bool = False
             ) -> Callable[[AsyncClient], Awaitable[Any]]:
    """SHOW of one job on ``node`` (a call for :meth:`Pool.on`), as
    :func:`show_pipeline` chooses it; raises what the node answers."""
    async def call(client: AsyncClient) -> Any:
        if _nobody(pool, node, body):
            try:
                reply = await client.execute_command("SHOW", job_id, "NOBODY")
            except DisqueError as exc:
                if not refuses_nobody(exc):
                    raise
                pool.show_nobody[node.address] = False
            else:
                pool.show_nobody[node.address] = True
                return reply
        return await client.execute_command("SHOW", job_id)
    return call


def body_size(fields: dict[str, Any]) -> int:
    """A job's body size from its SHOW fields, with or without the body."""
    body = fields.get("body")
    if isinstance(body, bytes | str):
        return len(body)
    return number(fields.get("body-size"))
