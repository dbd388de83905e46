"""The Disque client library: :class:`Client` (sync) and :class:`AsyncClient`.

Both speak RESP2 through redis-py (with the hiredis parser when installed),
so they work against this server and the original C Disque alike, and use
only commands and replies the original has.  See docs/CLIENT.md.

>>> from disque import Client
>>> with Client(["10.0.0.1:7711", "10.0.0.2:7711"]) as c:   # doctest: +SKIP
...     job_id = c.add_job("emails", b"hello", retry=60)
...     for job in c.get_jobs("emails", count=10, timeout_ms=1000):
...         c.ack(job.id)
"""

from typing import TYPE_CHECKING

from ..exceptions import (
    Acked,
    AuthError,
    BadId,
    ConnectionFailed,
    DisqueError,
    IdmpBusy,
    IdmpConflict,
    Leaving,
    Loading,
    MaxLen,
    Misconf,
    NoAuth,
    NoJob,
    NoPerm,
    NoRepl,
    OutOfMemory,
    Paused,
    ProtocolError,
    ResponseError,
    TooLate,
)
from ._base import DEFAULTS
from ._cluster import parse_address, parse_addresses
from ._wire import MAX_BULK_BODIES, Hello, Job, NodeInfo, PipelineReplies, is_unknown_command
from .sync import Client

if TYPE_CHECKING:
    from .aio import AsyncClient

__all__ = [
    "Client", "AsyncClient", "Job", "Hello", "NodeInfo", "DEFAULTS",
    "parse_address", "parse_addresses", "PipelineReplies", "MAX_BULK_BODIES",
    "is_unknown_command",
    "DisqueError", "ConnectionFailed", "ProtocolError", "ResponseError", "NoJob", "BadId",
    "NoRepl", "Paused", "Leaving", "MaxLen", "TooLate", "OutOfMemory", "Acked", "Loading",
    "Misconf", "AuthError", "NoAuth", "IdmpConflict", "IdmpBusy", "NoPerm",
]


def __getattr__(name: str) -> object:
    # AsyncClient loads on first use: most processes want the sync Client
    # only (the CLI, each Spark query's driver-side worker, the sink's
    # partitions), and the asyncio client module costs 10-20 ms to import.
    # (redis.asyncio itself is loaded either way: redis-py's own __init__
    # imports it.)
    if name == "AsyncClient":
        from .aio import AsyncClient

        globals()["AsyncClient"] = AsyncClient  # later lookups skip this hook
        return AsyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
