"""``disque monitor-queues``: a live QSTAT view of every queue of a node."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import IO

from ..client import Client

__all__ = ["monitor_args", "monitor_queues"]

_COLUMNS = ("queue", "len", "age", "idle", "blocked", "import-rate", "in/s", "out/s",
            "jobs-in", "jobs-out", "dead-lettered", "pause", "priorities", "rate-limit",
            "groups")


def _priorities(levels: object) -> str:
    """QSTAT's ``priorities`` (priority, count, ...) as ``10:1,3:2``; ``-`` without."""
    if not isinstance(levels, list) or not levels:
        return "-"
    return ",".join(f"{p}:{n}" for p, n in zip(levels[::2], levels[1::2], strict=True))


def _rate_limit(stat: dict[str, object]) -> str:
    """QSTAT's ``rate-limit`` as ``20/500ms`` with the jobs the window has
    left (``20/500ms:3``); ``-`` without one."""
    limit = stat.get("rate-limit")
    if not isinstance(limit, list) or len(limit) != 2:
        return "-"
    return f"{limit[0]}/{limit[1]}ms:{stat.get('rate-limit-left', '?')}"


def _groups(stat: dict[str, object]) -> str:
    """QSTAT's ordered groups as ``held/waiting:age`` (``3/1:12s``: 3 groups
    held, 1 with jobs waiting behind, for 12 s at most); ``-`` without."""
    if "groups-held" not in stat:
        return "-"
    return (f"{stat['groups-held']}/{stat.get('groups-waiting', '?')}:"
            f"{stat.get('oldest-waiting-group-age', '?')}s")


def monitor_queues(client: Client, out: IO[bytes], interval: float = 1.0,
                   count: int | None = None, minlen: int | None = None,
                   clear: bool = False, sleep: Callable[[float], None] = time.sleep) -> None:
    """Print a QSTAT table of every queue, refreshed every ``interval`` s.

    ``count`` stops after that many tables (tests and scripts); ``clear``
    redraws in place on a terminal instead of printing one table after the
    other.  Rates are computed from the jobs-in/jobs-out counter deltas.
    """
    previous: dict[str, tuple[int, int]] = {}
    previous_at: float | None = None
    shown = 0
    while True:
        now = time.monotonic()
        names = sorted(set(client.qscan(count=1000, minlen=minlen)))
        stats = [s for s in (client.qstat(name) for name in names) if s is not None]
        rows = []
        elapsed = (now - previous_at) if previous_at is not None else 0.0
        current: dict[str, tuple[int, int]] = {}
        for s in stats:
            name = str(s.get("name", ""))
            jobs_in, jobs_out = int(s.get("jobs-in", 0)), int(s.get("jobs-out", 0))
            current[name] = (jobs_in, jobs_out)
            rate_in = rate_out = ""
            if elapsed > 0 and name in previous:
                rate_in = f"{(jobs_in - previous[name][0]) / elapsed:.1f}"
                rate_out = f"{(jobs_out - previous[name][1]) / elapsed:.1f}"
            rows.append([name, str(s.get("len", "")), str(s.get("age", "")),
                         str(s.get("idle", "")), str(s.get("blocked", "")),
                         str(s.get("import-rate", "")), rate_in, rate_out, str(jobs_in),
                         str(jobs_out), str(s.get("dead-lettered", 0)),
                         str(s.get("pause", "")), _priorities(s.get("priorities")),
                         _rate_limit(s), _groups(s)])
        previous, previous_at = current, now
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(_COLUMNS)]
        lines = [f"{client.address}  {time.strftime('%H:%M:%S')}  queues: {len(rows)}"]
        lines.append("  ".join(c.upper().ljust(w) if i == 0 else c.upper().rjust(w)
                               for i, (c, w) in enumerate(zip(_COLUMNS, widths, strict=True))))
        for row in rows:
            lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                   for i, (v, w) in enumerate(zip(row, widths, strict=True))))
        text = "\n".join(lines) + "\n"
        if clear:
            text = "\x1b[H\x1b[2J" + text
        elif shown:
            text = "\n" + text
        out.write(text.encode("utf-8", "replace"))
        out.flush()
        shown += 1
        if count is not None and shown >= count:
            return
        sleep(interval)


def monitor_args(args: Sequence[str]) -> argparse.Namespace:
    """The options of ``monitor-queues`` (argparse prints the usage and exits on bad ones)."""
    parser = argparse.ArgumentParser(prog="disque monitor-queues",
                                     description="Live QSTAT view of every queue.")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--count", type=int, default=None, help="stop after N refreshes")
    parser.add_argument("--minlen", type=int, default=None,
                        help="only queues with at least N jobs queued")
    return parser.parse_args(list(args))

