"""The bus's connect attempts end on time and leave nothing behind.

A node reconnects to a peer that was killed or stopped every cron tick.
Each attempt must end (connected, refused, or given up after the node
timeout) and leave no task, callback or socket behind: attempts whose
cancellation never finished used to pile up with every such fault.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvloop

from disque.cluster.bus import connect_within


def _listener(backlog: int) -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)
    return server


def _full_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full: the kernel drops new SYNs, so
    a connect gets no answer at all (as to a peer stopped with a full
    backlog)."""
    server = _listener(0)
    queued = []
    for _ in range(8):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(server.getsockname())
        queued.append(client)
    time.sleep(0.2)  # the handshakes the queue takes complete in the kernel
    return server, queued


def _attempt(loop: asyncio.AbstractEventLoop, address: tuple[str, int],
             timeout_s: float) -> BaseException | None:
    async def one() -> BaseException | None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await connect_within(asyncio.get_running_loop(), sock, address, timeout_s)
            return None
        except (OSError, TimeoutError) as err:
            return err
        finally:
            sock.close()

    return loop.run_until_complete(one())


@pytest.fixture
def loop() -> asyncio.AbstractEventLoop:
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


def test_a_listening_peer_is_connected(loop: asyncio.AbstractEventLoop) -> None:
    server = _listener(16)
    try:
        assert _attempt(loop, server.getsockname(), 2.0) is None
    finally:
        server.close()


def test_a_closed_port_is_refused_at_once(loop: asyncio.AbstractEventLoop) -> None:
    server = _listener(16)
    address = server.getsockname()
    server.close()
    started = time.monotonic()
    error = _attempt(loop, address, 5.0)
    assert isinstance(error, ConnectionRefusedError) or (
        isinstance(error, OSError) and "refused" in str(error).lower()), error
    assert time.monotonic() - started < 1.0


def test_a_silent_peer_is_given_up_on_time_and_leaves_nothing(
        loop: asyncio.AbstractEventLoop) -> None:
    server, queued = _full_listener()
    try:
        errors = []
        started = time.monotonic()
        for _ in range(5):
            errors.append(_attempt(loop, server.getsockname(), 0.2))
        elapsed = time.monotonic() - started
        if not any(isinstance(e, TimeoutError) for e in errors):
            pytest.skip(f"this kernel answered the SYNs of a full backlog: {errors}")
        assert all(isinstance(e, TimeoutError) for e in errors), errors
        assert elapsed < 5 * 0.2 + 1.0
        # Nothing left on the loop: no task, and the timers were cancelled.
        assert not asyncio.all_tasks(loop)
    finally:
        for client in queued:
            client.close()
        server.close()
