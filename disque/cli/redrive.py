"""``disque redrive DEADQUEUE``: move dead letters back to the queue each died in.

The same task as the console's redrive (:mod:`disque.console.bulk`, which
needs nothing of the console's web stack): every node of the cluster
(found through HELLO from ``-h``/``-p``, or listed with ``--nodes``: over
TLS, every node's TLS address, since HELLO lists plain ports), each job
claimed with DEQUEUE and held with WORKING, added again with an idempotent
ADDJOB (IDMP keyed on the old job's ID), then acknowledged, no faster than
``--rate`` jobs a second.
``--journal FILE`` keeps the progress: the same command run again after a
crash or a Ctrl-C finishes the moves it had started (those it can no longer
verify are listed, to be checked), then goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..client import ConnectionFailed, DisqueError
from ..client._cluster import format_address

if TYPE_CHECKING:
    from ..console.bulk import Task

__all__ = ["redrive_args", "redrive"]


def redrive_args(args: Sequence[str]) -> argparse.Namespace:
    """The options of ``redrive`` (argparse prints the usage and exits on bad ones)."""
    parser = argparse.ArgumentParser(
        prog="disque redrive",
        description="Move the jobs of a dead-letter queue back to the queue each died in "
                    "(SHOW's dead-lettered-from), or to --to, without losing or "
                    "duplicating one.")
    parser.add_argument("queue", help="the dead-letter queue, e.g. orders:dead")
    parser.add_argument("--to", default="", help="send every job to this queue instead")
    parser.add_argument("--rate", default="100",
                        help="jobs per second at most (default 100, at most 10000)")
    parser.add_argument("--contains", default="", help="only jobs whose body contains TEXT")
    parser.add_argument("--origin", default="",
                        help="only jobs dead-lettered from a queue matching this glob")
    parser.add_argument("--limit", default="", help="move at most N jobs")
    parser.add_argument("--nodes", default="",
                        help="every node's address, host:port[,...] (default: -h/-p, the "
                             "others found through HELLO); over TLS, every node's TLS "
                             "address, since HELLO lists plain ports")
    parser.add_argument("--journal", type=Path, default=None,
                        help="keep the progress in FILE; the same command resumes from it")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args(list(args))


def _progress_line(task: Task) -> str:
    report = task.as_json()
    counts = report["counts"]
    total = counts["total"]
    of = f" of {total}" if total is not None else ""
    return (f"{task.spec.queue}: examined {counts['examined']}{of} ({report['percent']:.0f}%), "
            f"{task.summary()}, {report['rate_now']:.0f} jobs/s")


async def _run(options: argparse.Namespace, opts: argparse.Namespace, out: IO[bytes],
               err: IO[str]) -> int:
    from ..console.bulk import (
        Journal,
        SpecError,
        Task,
        TaskSpec,
        new_task_id,
        replay,
    )
    from ..console.nodes import Credentials, Pool
    from ..console.settings import Settings

    try:
        spec = TaskSpec.parse({"kind": "redrive", "queue": opts.queue, "to": opts.to,
                               "rate": opts.rate, "contains": opts.contains,
                               "origin": opts.origin, "limit": opts.limit})
    except SpecError as exc:
        err.write(f"disque redrive: {exc}\n")
        return 2
    address = format_address((options.host, options.port))
    seeds = tuple(a.strip() for a in opts.nodes.split(",") if a.strip()) or (address,)
    password = options.password or os.environ.get("DISQUE_PASSWORD") or None
    credentials = Credentials(options.user if password else None, password)
    cacert, cert = getattr(options, "cacert", None), getattr(options, "cert", None)
    settings = Settings(nodes=seeds, tls=bool(getattr(options, "tls", False) or cacert or cert),
                        tls_ca_file=cacert, tls_cert_file=cert,
                        tls_key_file=getattr(options, "key", None),
                        tls_verify=not getattr(options, "insecure", False))
    address = seeds[0]
    pool = Pool(seeds, credentials, settings)
    try:
        await pool.nodes(max_age=0)
        await pool.link(address).run(lambda c: c.ping())
    except (DisqueError, OSError) as exc:
        await pool.close()
        cause: BaseException = exc
        if isinstance(exc, ConnectionFailed) and exc.errors:
            cause = next(iter(exc.errors.values()))
        err.write(f"Could not connect to Disque at {address}: {cause}\n")
        return 1
    journal = Journal(opts.journal)
    resumed = None
    if opts.journal is not None and opts.journal.exists():
        resumed = replay(Journal.read(opts.journal))
        if resumed is None or not spec.same_work(resumed.spec):
            await pool.close()
            err.write(f"disque redrive: {opts.journal} is the journal of another task "
                      f"({resumed.spec.describe() if resumed else 'unreadable'}): give "
                      "another file\n")
            return 2
    if resumed is not None:
        task = Task(resumed.task_id, spec, credentials.user, pool, journal, resumed.created,
                    resumed)
        if resumed.claims:
            err.write(f"resuming: {len(resumed.claims)} moves started before are "
                      "finished first\n")
    else:
        task = Task(new_task_id(), spec, credentials.user, pool, journal)

    loop = asyncio.get_running_loop()
    runner = loop.create_task(task.run())
    interrupts = 0

    def interrupted() -> None:
        # The first Ctrl-C lets the current batch finish (no move is left
        # half done); a second one stops at once (the journal still knows).
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            err.write("\nstopping after the current batch (Ctrl-C again: at once)\n")
            task.cancel()
        else:
            runner.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, interrupted)
    tty = err.isatty() if hasattr(err, "isatty") else False
    every = 1.0 if tty else 5.0
    shown = time.monotonic()
    try:
        while not runner.done():
            await asyncio.wait({runner}, timeout=0.2)
            if not opts.quiet and time.monotonic() - shown >= every and not runner.done():
                shown = time.monotonic()
                line = _progress_line(task)
                err.write(f"\r{line}\x1b[K" if tty else line + "\n")
                err.flush()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    if tty and not opts.quiet:
        err.write("\n")
    report = task.as_json()
    out.write((f"redrive {spec.queue}: {task.state}: {task.summary()} in "
               f"{report['elapsed']:.1f} s\n").encode("utf-8", "surrogateescape"))
    for problem in task.problems:
        err.write(f"  {problem}\n")
    if task.unverified:
        err.write(f"moves to check ({len(task.unverified)}; see the problems above):\n")
        for entry in task.unverified:
            err.write(f"  {entry.get('old')} -> {entry.get('target')}: {entry.get('why')}\n")
    out.flush()
    if interrupts:
        return 130
    return 0 if task.state == "finished" and not task.counts.failed and not task.in_flight \
        else 1


def redrive(options: argparse.Namespace, args: Sequence[str], out: IO[bytes],
            err: IO[str] = sys.stderr) -> int:
    """Run ``disque redrive ...``; returns the exit status."""
    try:
        opts = redrive_args(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return asyncio.run(_run(options, opts, out, err))
