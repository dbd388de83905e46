"""The templates (Jinja2, autoescaped) and the filters pages format numbers with."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import jinja2

__all__ = ["environment", "human_bytes", "human_seconds"]


def human_bytes(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def human_seconds(value: Any) -> str:
    if value is None:
        return "-"
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m {seconds % 60:.0f}s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h {seconds % 3600 // 60:.0f}m"
    return f"{seconds // 86400:.0f}d {seconds % 86400 // 3600:.0f}h"


def _rate(value: Any) -> str:
    return "-" if value is None else (f"{value:.1f}" if value < 100 else f"{value:.0f}")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("disque.console", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update({
        "bytes": human_bytes, "seconds": human_seconds, "rate": _rate,
        # A queue name or job ID inside a path: every reserved character escaped.
        # A name that is not UTF-8 (surrogates from the replies) keeps its bytes.
        "path": lambda v: quote(str(v), safe="", errors="surrogateescape"),
        # A page's query string with some values changed: ``flt|query(page=2)``.
        "query": lambda values, **changes: urlencode(
            {k: v for k, v in {**values, **changes}.items() if v not in ("", None)}),
    })
    return env
