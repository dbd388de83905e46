"""Fixtures for multi-node tests: N real nodes on loopback, joined."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined
from tests.support.process import DisqueProcess


@pytest.fixture
def make_cluster(server_factory) -> Callable[..., list[DisqueProcess]]:
    """``make_cluster(3)``: three nodes with a short node timeout, fully joined.

    ``joined=False`` leaves them strangers; ``chain=True`` introduces each
    node to the next only, so the rest must come from gossip.
    """

    def make(n: int, *args: str, joined: bool = True, chain: bool = False,
             node_timeout: int = TEST_NODE_TIMEOUT_MS) -> list[DisqueProcess]:
        nodes = [server_factory("--cluster-node-timeout", str(node_timeout), *args)
                 for _ in range(n)]
        if joined:
            join(nodes, chain=chain)
            wait_joined(nodes)
        return nodes

    return make
