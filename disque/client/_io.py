"""The calls where redis-py's asyncio and sync APIs differ, in both flavours.

The client is written once, for asyncio, in ``aio.py``; ``sync.py`` is
generated from it by ``scripts/unasync.py``, which renames the asynchronous
names here to their synchronous twins: ``AsyncLock`` -> ``Lock``,
``asleep`` -> ``sleep``, ``aread_reply`` -> ``read_reply``,
``aclose_connection`` -> ``close_connection``.  Each pair does the same
thing; what cannot be written the same way in both flavours lives here.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

__all__ = [
    "AsyncLock", "Lock", "asleep", "sleep", "aread_reply", "read_reply",
    "aclose_connection", "close_connection",
]

#: Serializes the commands of one client on its connection.
AsyncLock = asyncio.Lock
#: The same for threads; reentrant, so a thread that calls the client again
#: from :meth:`Client.send_pipeline`'s ``build`` callback does not deadlock.
Lock = threading.RLock

asleep = asyncio.sleep
sleep = time.sleep


async def aread_reply(conn: redis.asyncio.Connection, timeout: float | None) -> Any:
    """The next reply on ``conn``, waiting at most ``timeout`` seconds (None: forever).

    The limit is kept here: given ``timeout=``, redis.asyncio answers None
    when it expires (indistinguishable from a nil reply), where a timeout
    must raise redis' TimeoutError as the sync flavour does.
    """
    if timeout is None:
        return await conn.read_response(timeout=math.inf)
    try:
        async with asyncio.timeout(timeout):
            return await conn.read_response(timeout=math.inf)
    except TimeoutError as exc:
        raise redis.exceptions.TimeoutError("Timeout reading from socket") from exc


def read_reply(conn: redis.Connection, timeout: float | None) -> Any:
    """The next reply on ``conn``, waiting at most ``timeout`` seconds (None: forever)."""
    return conn.read_response(timeout=timeout)


async def aclose_connection(conn: redis.asyncio.Connection, wait: bool = False) -> None:
    """Close ``conn``; errors of an already broken connection are ignored.

    ``wait`` for the transport to be closed: a TLS shutdown runs on after
    ``close()``, and an event loop that ends first leaks the socket.
    """
    try:
        await conn.disconnect(nowait=not wait)
    except Exception:  # closing a broken connection: nothing more to do
        pass


def close_connection(conn: redis.Connection, wait: bool = False) -> None:
    """Close ``conn``; errors of an already broken connection are ignored.

    The socket is closed before this returns, so ``wait`` changes nothing.
    """
    try:
        conn.disconnect()
    except Exception:  # closing a broken connection: nothing more to do
        pass
