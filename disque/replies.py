"""Reply values that are subclasses of builtins: a RESP status string and a map.

They live apart from :mod:`disque.protocol` because that module is compiled
by mypyc (see ``disque/_native.py``), which cannot make a native class of a
``str`` or ``list`` subclass; here they stay ordinary Python classes, and
the protocol imports them.
"""

from __future__ import annotations

__all__ = ["Map", "Status"]


class Status(str):
    """A RESP simple string (``+OK``); plain ``str`` values are bulk strings."""

    __slots__ = ()


class Map(list):  # type: ignore[type-arg]
    """Key/value pairs: a map for RESP3 clients, a flat array for RESP2 clients."""

    __slots__ = ()
