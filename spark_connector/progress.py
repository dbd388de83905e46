"""The source's figures in Spark's progress reports, kept across driver restarts.

The Python Data Source API gives a source one place for per-query values:
the offsets it returns.  ``latestOffset`` returns ``{"batch": n, "jobs":
k, ...figures}``; Spark shows it as the batch's ``endOffset`` (and writes it
to its offset log), and ``reportLatestOffset`` shows the same figures, as
they are when Spark asks, as ``latestOffset``.  Spark does not call
``latestOffset`` for a batch it replays after a restart, so there
``latestOffset`` is null, while ``endOffset`` is the offset logged for the
replayed batch: its figures as they were when it was staged.  Hence the
docs read ``endOffset``.

The counters (jobs fetched, acknowledged, ...) add up over the query's life:
a restarted driver starts from the figures of the offset Spark hands it
(the last batch's), so they do not fall back to 0 at a restart.  What the
crashed process counted after that offset was logged is not in them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Progress", "CARRIED"]

#: Counters that add up over the query's life, carried across restarts in
#: the offsets.  The others are gauges, read afresh: ``queueLength``,
#: ``jobsLeased``, ``nodes``, ``deadLettered`` and ``rateLimited`` (the nodes'
#: own totals, from QSTAT).
CARRIED = ("jobsFetched", "jobsAcked", "redeliveredSeen", "batchesStaged", "leasesLost")


class Progress:
    """Counters and per-node figures of one query's driver side."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {"jobsFetched": 0, "jobsAcked": 0,
                                         "redeliveredSeen": 0, "queueLength": 0,
                                         "batchesStaged": 0}
        #: What earlier driver processes of this query counted (from the
        #: first offset Spark gave this one).
        self.carried: dict[str, int] = dict.fromkeys(CARRIED, 0)
        #: address -> {"fetched": jobs it delivered, "queued": QLEN last seen}.
        self.per_node: dict[str, dict[str, int]] = {}
        #: The source's own steps, the last of each, in ms (see :meth:`timed`).
        self.timings: dict[str, int] = {}
        self._lock = threading.Lock()

    def carry(self, offset: Mapping[str, Any]) -> None:
        """Start from the figures of ``offset`` (one this source returned)."""
        for name in CARRIED:
            value = offset.get(name)
            if isinstance(value, int) and value >= 0:
                self.carried[name] = value

    def timed(self, step: str, seconds: float) -> None:
        """The last ``step`` took ``seconds``: ``startMs`` (this driver
        process's start: nodes and store checked, staged batches recovered),
        ``fetchMs`` (the GETJOB loop of a batch), ``stageMs`` (writing it, or
        executor mode's plan, to ``stagingPath``), ``ackMs`` (its ACK)."""
        with self._lock:
            self.timings[step] = round(seconds * 1000)

    def count_node(self, address: str, key: str, value: int, *, add: bool = True) -> None:
        with self._lock:
            node = self.per_node.setdefault(address, {"fetched": 0, "queued": 0})
            node[key] = node[key] + value if add else value

    def report(self, batch: int, *, leased: int, leases_lost: int,
               node_ids: Mapping[str, object], up: Callable[[str], bool]) -> dict[str, Any]:
        """The figures, as ``latestOffset`` reports them."""
        with self._lock:
            nodes = {address: {**counts, "up": up(address)}
                     for address, counts in sorted(self.per_node.items())}
            timings = dict(self.timings)
        for address in node_ids:
            nodes.setdefault(address, {"fetched": 0, "queued": 0, "up": up(address)})
        counters: dict[str, Any] = {**self.counters, "leasesLost": leases_lost}
        for name in CARRIED:
            counters[name] += self.carried[name]
        return {"batch": batch, **{k: v for k, v in counters.items() if k != "leasesLost"},
                "jobsLeased": leased, "leasesLost": counters["leasesLost"], "nodes": nodes,
                "timingsMs": timings}
