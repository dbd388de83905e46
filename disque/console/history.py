"""Per-node counters sampled about once a second, kept for a bounded window.

Cost per node and sample: one ``INFO``.  This server's nodes count the
jobs they added, delivered and acknowledged (``added_jobs``,
``delivered_jobs``, ``acked_jobs`` in ``INFO stats``), which the add,
deliver and ACK rates are charted from; an original node has no such
counters, so it also gets ``INFO commandstats`` (its ADDJOB, GETJOB and
ACKJOB calls, kept as series but not charted: calls are not jobs).  The
sampler never walks the queues: its cost does not grow with their number.
Flower keeps its history in memory and loses it on restart:
here every sample is also a line of ``history.jsonl`` in the data
directory, read back at start, and the file is rewritten to the window when
it holds twice as many lines (so it never grows past two windows).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from disque.client import AsyncClient

from .nodes import Answer, Pool

__all__ = ["COUNTERS", "GAUGES", "JOB_COUNTERS", "History", "Sampler"]

log = logging.getLogger("disque.console")

#: INFO fields that only grow: charts show their rate per second.
COUNTERS = ("total_commands_processed", "total_net_input_bytes", "total_net_output_bytes",
            "added_jobs", "delivered_jobs", "acked_jobs", "addjob_calls", "getjob_calls",
            "ackjob_calls")
#: The job counters of this server's nodes (the add, deliver and ACK charts).
JOB_COUNTERS = ("added_jobs", "delivered_jobs", "acked_jobs")
#: INFO fields shown as they are.
GAUGES = ("used_memory", "maxmemory", "registered_jobs", "registered_queues",
          "connected_clients", "blocked_clients")


class History:
    """The window of samples: ``(time, {address: {field: value}})``, oldest first."""

    def __init__(self, seconds: int, interval: float, path: Path | None = None) -> None:
        self.seconds = seconds
        self.samples: deque[tuple[float, dict[str, dict[str, float]]]] = deque(
            maxlen=int(seconds / interval * 1.2) + 10)
        self.path = path
        self._lines = 0
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        horizon = time.time() - self.seconds
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                self._lines += 1
                try:
                    entry = json.loads(line)
                    when, nodes = float(entry["t"]), entry["n"]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash mid-write
                if when >= horizon and isinstance(nodes, dict):
                    self.samples.append((when, nodes))

    def add(self, when: float, nodes: dict[str, dict[str, float]]) -> None:
        self.samples.append((when, nodes))
        while self.samples and self.samples[0][0] < when - self.seconds:
            self.samples.popleft()
        if self.path is None:
            return
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"t": round(when, 3), "n": nodes}, separators=(",", ":"))
                      + "\n")
        self._lines += 1
        if self._lines > 2 * max(len(self.samples), 1) + 100:
            self._compact()

    def _compact(self) -> None:
        assert self.path is not None
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as out:
            for when, nodes in self.samples:
                out.write(json.dumps({"t": round(when, 3), "n": nodes}, separators=(",", ":"))
                          + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        self._lines = len(self.samples)

    def series(self, name: str, since: float = 0.0,
               nodes: Iterable[str] | None = None) -> dict[str, list[tuple[float, float]]]:
        """``name`` per node as ``[(time, value)]``: a rate for counters.

        A counter that went down (a restarted node) gives no point for that step.
        """
        wanted = set(nodes) if nodes is not None else None
        out: dict[str, list[tuple[float, float]]] = {}
        last: dict[str, tuple[float, float]] = {}
        for when, sample in self.samples:
            for address, fields in sample.items():
                if wanted is not None and address not in wanted:
                    continue
                value = fields.get(name)
                if value is None:
                    continue
                if name in COUNTERS:
                    before = last.get(address)
                    last[address] = (when, value)
                    if before is None or value < before[1] or when <= before[0]:
                        continue
                    point = (value - before[1]) / (when - before[0])
                else:
                    point = value
                if when >= since:
                    out.setdefault(address, []).append((round(when, 3), round(point, 3)))
        return out

    def total(self, name: str, since: float = 0.0) -> list[tuple[float, float]]:
        """``name`` summed over the nodes at each sample time."""
        sums: dict[float, float] = {}
        for points in self.series(name, since).values():
            for when, value in points:
                sums[when] = sums.get(when, 0.0) + value
        return sorted(sums.items())


def _fields(info: dict[str, dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for section in info.values():
        for key, value in section.items():
            if (key in COUNTERS or key in GAUGES) and isinstance(value, int | float):
                out[key] = float(value)
    return out


def _calls(info: dict[str, dict[str, Any]]) -> dict[str, float]:
    """addjob/getjob/ackjob calls from ``INFO commandstats`` (``calls=N,usec=...``)."""
    out: dict[str, float] = {}
    stats = info.get("commandstats", {})
    for command in ("addjob", "getjob", "ackjob"):
        raw = stats.get(f"cmdstat_{command}")
        if isinstance(raw, str):
            for part in raw.split(","):
                key, _, value = part.partition("=")
                if key == "calls" and value.isdigit():
                    out[f"{command}_calls"] = float(value)
    return out


class Sampler:
    """Samples every node of ``pool`` each ``interval`` seconds into ``history``."""

    def __init__(self, pool: Pool, history: History, interval: float) -> None:
        self.pool = pool
        self.history = history
        self.interval = interval
        #: address -> whether the node answers INFO commandstats with counters
        #: (asked only of nodes without the job counters).
        self._commandstats: dict[str, bool] = {}
        self.last_problems: dict[str, str] = {}

    async def sample_once(self) -> None:
        nodes = await self.pool.nodes()

        async def read(client: AsyncClient) -> dict[str, float]:
            fields = _fields(await client.info())
            address = client.address or ""
            if "added_jobs" not in fields and self._commandstats.get(address, True):
                calls = _calls(await client.info("commandstats"))
                self._commandstats[address] = bool(calls)
                fields.update(calls)
            return fields

        answers: list[Answer[dict[str, float]]] = await self.pool.each(read, nodes)
        sample: dict[str, dict[str, float]] = {}
        self.last_problems = {}
        for answer in answers:
            if answer.value is None:
                self.last_problems[answer.node.address] = str(answer.problem)
                continue
            sample[answer.node.address] = answer.value
        if sample:
            self.history.add(time.time(), sample)

    async def run(self) -> None:
        """Sample until cancelled; a failed round is logged and the next one runs."""
        while True:
            started = time.monotonic()
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the sampler must outlive any node's reply
                log.warning("sampling failed: %r", exc)
            await asyncio.sleep(max(0.05, self.interval - (time.monotonic() - started)))
