"""A client that keeps a connection whose HELLO got -NOAUTH (``_hello_optional``).

The CLI's client does this, like redis-cli: the node then answers each
command itself (PING before AUTH, -NOAUTH to the rest, AUTH logs in).  Both
flavours have it, since sync.py is generated from aio.py; a plain client
still raises NoAuth at connect (tests/client/test_cli.py, test_async.py).
"""

from __future__ import annotations

import asyncio

import pytest

from disque import AsyncClient, Client, NoAuth
from tests.client.conftest import address
from tests.support.process import DisqueProcess


class PromptClient(Client):
    _hello_optional = True


class AsyncPromptClient(AsyncClient):
    _hello_optional = True


@pytest.fixture
def secured(server_factory) -> DisqueProcess:
    return server_factory("--requirepass", "pw")


def test_sync_client_keeps_a_connection_refused_its_hello(secured: DisqueProcess) -> None:
    with PromptClient(address(secured), reconnect_timeout=0) as c:
        assert c.ping() == b"PONG"
        assert c.node_id is None  # no HELLO, so no node table either
        with pytest.raises(NoAuth):
            c.qlen("q")
        assert c.execute_command("AUTH", "pw") == b"OK"
        assert c.qlen("q") == 0


def test_async_client_keeps_a_connection_refused_its_hello(secured: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncPromptClient(address(secured), reconnect_timeout=0) as c:
            assert await c.ping() == b"PONG"
            assert c.node_id is None
            with pytest.raises(NoAuth):
                await c.qlen("q")
            assert await c.execute_command("AUTH", "pw") == b"OK"
            assert await c.qlen("q") == 0
    asyncio.run(main())

