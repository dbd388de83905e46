"""What ``from disque.client import Client`` loads, in a fresh interpreter.

Processes that want only the sync client (the CLI, the Python worker Spark
starts for each streaming query's driver side, the sink's partitions) must
not pay for the asyncio client module: it loads on first use of
``AsyncClient``.  ``redis.asyncio`` is not checked: redis-py's own
``__init__`` imports it (``from redis import asyncio``), so any use of
redis-py loads it; what this package can keep out is its own async layer.
"""

from __future__ import annotations

import pytest

from tests.support.fresh import run_fresh


def test_the_sync_client_does_not_load_the_async_one() -> None:
    out = run_fresh("""
import json, sys
from disque.client import Client
import disque
sync_only = "disque.client.aio" in sys.modules
c = disque.Client("127.0.0.1:1")  # through the package's lazy names too: no connection yet
sync_only = sync_only or "disque.client.aio" in sys.modules
print(json.dumps({"aio_loaded": sync_only, "client": Client.__module__}))
""")
    assert out == {"aio_loaded": False, "client": "disque.client.sync"}


def test_async_client_loads_on_first_use_by_every_spelling() -> None:
    out = run_fresh("""
import json, sys
import disque.client
from disque.client import AsyncClient
from disque import AsyncClient as FromPackage
import disque.client.aio
listed = "AsyncClient" in disque.client.__all__ and "AsyncClient" in dir(disque.client)
namespace = {}
exec("from disque.client import *", namespace)
print(json.dumps({
    "same": AsyncClient is FromPackage is disque.client.AsyncClient
            is disque.client.aio.AsyncClient is namespace["AsyncClient"],
    "listed": listed, "module": AsyncClient.__module__}))
""")
    assert out == {"same": True, "listed": True, "module": "disque.client.aio"}


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import disque.client

    with pytest.raises(AttributeError, match="NoSuchThing"):
        disque.client.NoSuchThing  # noqa: B018 - the lookup is the test


def test_the_client_and_the_connector_never_look_at_the_core() -> None:
    # Spark's executors import only these: no compiled module, no check of
    # the build (which would hash the core's sources and could warn).
    out = run_fresh("""
import json, sys
import disque.client
import disque._native as native
try:
    import spark_connector, pyspark_disque
except ImportError:  # without the 'spark' extra: the client alone
    pass
core = sorted(m for m in native.COMPILED_MODULES if m in sys.modules)
print(json.dumps({"core": core, "decided": native._decided}))
""")
    assert out == {"core": [], "decided": False}
