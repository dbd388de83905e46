"""A fixed-bucket latency histogram, cheap to feed from the node's own code.

Prometheus's ``Histogram`` takes a lock per observation; the node is one
event loop, so a list of counts and a bisect do (``metrics.py`` turns them
into the exposition's cumulative buckets at scrape time).
"""

from __future__ import annotations

from typing import Final

__all__ = ["REPLICATION_BUCKETS_S", "LatencyHistogram"]

#: From a loopback round trip to a replication that needed extra nodes
#: (added every 50 ms) or waited for a slow peer.
REPLICATION_BUCKETS_S: Final[tuple[float, ...]] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LatencyHistogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        #: One count per bound (values <= bound and above the previous one), then +Inf.
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left as a scan: compiled, a few float comparisons (most
        # observations fall in the first buckets) cost less than the call
        # into the bisect module (~1k instructions per replicated ADDJOB).
        bounds = self.bounds
        index = 0
        end = len(bounds)
        while index < end and bounds[index] < seconds:
            index += 1
        self.counts[index] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as Prometheus writes it, observations <= it), +Inf last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
