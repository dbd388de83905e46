"""Disque, a distributed in-memory job queue, as a Python node and client."""

from . import _native

__version__ = "1.0.0"

# Compiled core or source: decided when the first core module is imported,
# so the client alone (the CLI, Spark's executors) never looks at the core.
_native.activate_before_core()

__all__ = [
    "__version__",
    "Client", "AsyncClient", "Job", "Hello", "NodeInfo",
    "DisqueError", "ConnectionFailed", "ProtocolError", "ResponseError", "NoJob", "BadId",
    "NoRepl", "Paused", "Leaving", "MaxLen", "TooLate", "OutOfMemory", "Acked", "Loading",
    "Misconf", "AuthError", "NoAuth", "IdmpConflict", "IdmpBusy", "NoPerm",
]

_CLIENT_NAMES = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> object:
    # Lazy: the server imports this package too and must not pay for (or
    # depend on) redis-py; ``from disque import Client`` still works.
    if name in _CLIENT_NAMES:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'disque' has no attribute {name!r}")
