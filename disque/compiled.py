"""What the compiled core takes from ``mypy_extensions``, without it at run time.

``mypyc_attr`` tunes how mypyc compiles a class (a base class that the
tests' stand-ins may subclass; a class whose instances can never be part
of a reference cycle, which the cyclic collector then does not track);
``i64`` is a machine integer in the compiled core (arithmetic and
comparisons without the checks an ``int``, which may be boxed, needs).  Both come from
``mypy_extensions``, which the build has (mypy brings it) but an installed
node need not: mypyc reads them while it compiles, and when the source runs
interpreted the decorator does nothing and ``i64`` is ``int``.
"""

from __future__ import annotations

__all__ = ["i64", "mypyc_attr"]

try:
    from mypy_extensions import i64 as i64
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # an installed node without mypy: nothing to tune
    i64 = int  # type: ignore[misc]

    def mypyc_attr(*attrs: str, **kwattrs: object) -> object:  # type: ignore[misc]
        return lambda cls: cls
