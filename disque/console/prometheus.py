"""Links from the console's charts to the same series in Prometheus (no I/O).

With ``--prometheus-url``, each chart links to a Prometheus graph of the
series it draws, written in PromQL over the names a node exports on its
``metrics-port`` (:mod:`disque.metrics`): the console's figures are
cluster sums of per-node counters, so each expression is a ``sum`` of
``rate(...[1m])`` (of a gauge for a queue's length).  The console never
talks to Prometheus itself.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode, urlsplit

__all__ = ["OVERVIEW_SERIES", "QUEUE_SERIES", "check_url", "graph_url", "overview_links",
           "queue_links", "promql_string"]

#: The overview's chart series and the node's metric each comes from.
OVERVIEW_SERIES: dict[str, str] = {
    "added": "disque_jobs_added_total",
    "delivered": "disque_jobs_delivered_total",
    "acked": "disque_jobs_acked_total",
    "commands": "disque_commands_processed_total",
}
#: A queue's chart series: its length (a gauge), jobs in and out (counters).
QUEUE_SERIES: dict[str, str] = {
    "length": "disque_queue_length",
    "in": "disque_queue_enqueued_total",
    "out": "disque_queue_dequeued_total",
}
#: How far back the graphs look.
RANGE = "1h"


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or ValueError when it is no http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return url.rstrip("/")


def promql_string(value: str) -> str:
    """``value`` as a PromQL string literal.  A queue name that is not UTF-8
    (its bytes kept as surrogates) is written as the node exports its
    label: undecodable bytes as ``\\xNN`` text."""
    label = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    # PromQL's double-quoted strings take Go's escapes, which JSON's are.
    return json.dumps(label, ensure_ascii=False)


def graph_url(base: str, expressions: list[str]) -> str:
    """A Prometheus graph page with one panel per expression."""
    params: dict[str, str] = {}
    for i, expr in enumerate(expressions):
        params |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.range_input": RANGE}
    return f"{base}/graph?{urlencode(params)}"


def _rate(metric: str, selector: str = "") -> str:
    return f"sum(rate({metric}{selector}[1m]))"


def overview_links(base: str) -> dict[str, str]:
    """The overview's charts: ``flow`` (added, delivered, acked) and ``commands``."""
    flow = [_rate(OVERVIEW_SERIES[k]) for k in ("added", "delivered", "acked")]
    return {"flow": graph_url(base, flow),
            "commands": graph_url(base, [_rate(OVERVIEW_SERIES["commands"])])}


def queue_links(base: str, queue: str) -> dict[str, str]:
    """A queue's chart: its length, jobs in and out per second, on every node."""
    selector = "{queue=" + promql_string(queue) + "}"
    return {"queue": graph_url(base, [
        f"sum({QUEUE_SERIES['length']}{selector})",
        _rate(QUEUE_SERIES["in"], selector), _rate(QUEUE_SERIES["out"], selector)])}
