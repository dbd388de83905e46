"""CPU instructions the node spends per command, counted by valgrind (callgrind).

Wall-clock throughput on a shared 2-core VM varies by +-20% between runs
minutes apart, which hides a 5% change.  Instruction counts do not vary:
callgrind counts the instructions the node's process executes, whatever the
rest of the machine does.  This runs a fresh node under callgrind twice,
``redis-benchmark`` sends it ``--small`` and then ``--large`` requests of
one command, and the difference of the two totals divided by the difference
of the request counts is the cost of one command: start-up and shutdown
cancel out.  The cron's work does not quite: the larger run lasts longer
under callgrind, so a little of it lands in the per-command figure.  The
measured node therefore runs with ``hz 1`` (one cron tick a second rather
than 10); repeated runs agree within ~2%, and a run on a loaded machine no
longer drifts with its wall-clock time.  Kernel time (the syscalls
themselves) is not counted; the user-space side of them is.

The interpreter's exit (``Py_FinalizeEx``, after SHUTDOWN has returned from
the node's ``main``) is not counted either: the totals are those of
callgrind's dump taken as it is entered.  Its cost depends on the clock, not
on the commands: it runs full garbage collections, which walk every object
the collector still sees, and the node's collector policy
(disque/cyclic_gc.py) hides the start-up heap from them only at its first
``gc.freeze()``, on the first cron tick a second after start.  A node shut
down before that tick spent ~32 M more instructions exiting than one shut
down after it (40.6 M against 8.4 M), so when only the larger run reached
the tick the two totals came out equal: ~0 instructions per command.

Usage (from the repository root)::

    python3 -m benchmarks.instructions [--pipeline 16] [--small 4000] [--large 20000] \\
        [--node floor] [--profile PATH] ADDJOB q body 0

``--prefill N`` first adds N jobs (``ADDJOB q <body> 0``, pipelined) to the
queue named by ``--prefill-queue`` (default ``q``), in both runs, so that
``GETJOB NOHANG FROM q`` has jobs to take: the fill's instructions cancel
out in the difference.  N must exceed ``--large``.  ``--prefill-options``
adds ADDJOB options to the fill (``"PRIORITY 5"``: a queue of prioritized
jobs).

``--as-user RULES`` makes the measured node's ``aclfile`` hold one user,
``bench``, with those ACL rules (``"~q* +@read +@write"``: the permission
check a user limited to some commands and queues pays on every command),
and ``redis-benchmark`` authenticates as that user.

``--cluster 3`` joins the measured node to two plain nodes first (the
commands go to the measured node; with ``--measure peer`` they go to a plain
node and the measured one is a peer receiving REPLJOBs): the cost of one
replicated ADDJOB on the node that creates it, or on a node that copies it.

``--ack N`` replaces ``redis-benchmark`` by the ACKs of fetched jobs, N IDs
per ACKJOB (the Spark source's path, see :func:`acks`); the figure is per
job acked.  It needs ``--prefill``.

``--pickup`` replaces ``redis-benchmark`` by one job at a time handed to a
consumer blocked in GETJOB (the ``latency`` scenario's path, see
:func:`pickups`): the instructions per pickup are the node's share of
that latency.  ``--pickup-gate`` runs the same load without the jobs (the
PING that orders each round), to subtract.

``--node redis`` counts ``redis-server`` (``--save '' --appendonly no``,
``hz 1``) the same way, for a reference beside ours: ``XADD s * f body``
for ADDJOB, ``RPOP q`` with ``--prefill`` (which then fills with ``LPUSH q
<body>``) for GETJOB NOHANG.  Its whole run is counted (it has no
interpreter exit to leave out; SHUTDOWN NOSAVE costs the same in both).

``--cache-sim`` turns on callgrind's cache simulation (``--cache-sim=yes``:
the first-level caches and the last-level one of this machine's geometry,
simulated, not measured) and reports its misses per command beside the
instructions: data reads and writes missing L1 (``D1mr + D1mw``) and the
last level (``DLmr + DLmw``), instruction fetches missing L1 (``I1mr``);
and its branch predictor's (``--branch-sim=yes``) mispredicted
conditional and indirect branches (``Bcm + Bim``).
An estimate where ``perf stat`` has no hardware counters (a VM without a
PMU: its ``cache-misses`` are ``<not supported>``).

Under callgrind the node runs ~50x slower; the default counts take about
half a minute.  Needs ``valgrind`` (Debian package valgrind) and
``redis-benchmark`` (redis-tools).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.redis_tools import benchmark_command, run_benchmark, tool_version
from benchmarks.run import FLOOR_NODE, NODE_ARGS
from tests.support.process import DisqueProcess, raw_command, wait_for

TOTAL = re.compile(rb"Collected : (\d+)")
SUMMARY = re.compile(rb"^summary: (\d+)$", re.MULTILINE)
#: With --cache-sim: the events callgrind counted, and their totals.
EVENTS = re.compile(rb"^events: (.+)$", re.MULTILINE)
SUMMARY_LINE = re.compile(rb"^summary: (.+)$", re.MULTILINE)
#: The misses --cache-sim reports per command, as sums of callgrind's events.
MISSES: dict[str, tuple[str, ...]] = {
    "L1 data misses": ("D1mr", "D1mw"),
    "LL data misses": ("DLmr", "DLmw"),
    "L1 instruction misses": ("I1mr",),
    "mispredicted branches": ("Bcm", "Bim"),
}
#: The interpreter's exit, not counted (see the module docstring).
EXIT_FUNCTION = "Py_FinalizeEx"
PICKUP_QUEUE = "pickup"


def pickups(port: int, count: int, jobs: bool = True) -> None:
    """``count`` jobs, one at a time, each to a consumer already blocked in GETJOB.

    One process drives both connections, so no polling is needed to know the
    consumer is blocked: its GETJOB is in the node's socket before the
    producer's PING is sent, so the node has read (and parked) it by the
    time it answers the PING; then the ADDJOB goes out.  Without ``jobs``
    only the PINGs run (the gate's own cost).
    """
    import redis

    consumer = redis.Connection(host="127.0.0.1", port=port, protocol=2)
    producer = redis.Connection(host="127.0.0.1", port=port, protocol=2)
    try:
        for _ in range(count):
            if jobs:
                consumer.send_command("GETJOB", "TIMEOUT", 60_000, "FROM", PICKUP_QUEUE)
            producer.send_command("PING")
            producer.read_response()
            if jobs:
                producer.send_command("ADDJOB", PICKUP_QUEUE, "body", 0)
                producer.read_response()
                if not consumer.read_response():
                    raise RuntimeError("the blocked GETJOB got no job")
    finally:
        consumer.disconnect()
        producer.disconnect()


def acks(port: int, count: int, jobs: int, per_command: int, queue: str) -> None:
    """Fetch all ``jobs`` jobs of the queue, then acknowledge ``count`` of them.

    The Spark source's path: GETJOB hands out a batch, and once Spark has
    committed it the IDs go back in ACKJOBs of ``per_command`` IDs each,
    pipelined (``ack_many``).  Both runs fetch the same ``jobs`` (the
    prefill), so only the ACKs differ between them.
    """
    import redis

    connection = redis.Connection(host="127.0.0.1", port=port, protocol=2)
    try:
        ids: list[bytes] = []
        while len(ids) < jobs:
            connection.send_command("GETJOB", "NOHANG", "COUNT", 1000, "FROM", queue)
            batch = connection.read_response() or []
            if not batch:
                raise RuntimeError(f"the queue held {len(ids)} jobs, not {jobs}")
            ids.extend(entry[1] for entry in batch)
        chunks = [ids[start:start + per_command]
                  for start in range(0, count, per_command)]
        chunks[-1] = chunks[-1][:count - per_command * (len(chunks) - 1)]
        connection.send_packed_command(connection.pack_commands(
            [("ACKJOB", *chunk) for chunk in chunks]))
        acked = sum(connection.read_response() for _ in chunks)
        if acked != count:
            raise RuntimeError(f"{acked} jobs acked, not {count}")
    finally:
        connection.disconnect()


def count_instructions(root: Path, command: list[str], requests: int, pipeline: int,
                       node: str, cluster: int = 1, measure: str = "creator",
                       profile: str | None = None, prefill: int = 0,
                       prefill_queue: str = "q", prefill_options: tuple[str, ...] = (),
                       as_user: str | None = None,
                       load: Callable[[int, int], None] | None = None,
                       cache_sim: bool = False) -> dict[str, int]:
    """callgrind's totals for one node process that served ``requests`` of
    ``command``: ``{"Ir": instructions}``, and with ``cache_sim`` the cache
    simulation's events too (``D1mr``, ``DLmw``, ...).

    Counted from the process's start until the interpreter's exit begins
    (``Py_FinalizeEx``, whose cost depends on when the last ``gc.freeze()``
    happened rather than on the commands: see the module docstring); a
    ``redis-server`` (``node="redis"``) until it exits.

    ``load(port, requests)``, if given, replaces ``redis-benchmark`` (and
    ``command``, ``pipeline``: :func:`pickups`).

    ``profile`` is where the counted part of callgrind's profile is copied
    (``callgrind_annotate`` reads it; compiled modules show their functions
    as ``CPyDef_<module>___<function>``).
    """
    workdir = root / f"{node}-{requests}"
    out = workdir / "callgrind.out"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    if cache_sim:
        valgrind += ["--cache-sim=yes", "--branch-sim=yes"]
    if node == "redis":
        return _count_redis(workdir, out, valgrind, command, requests, pipeline, profile,
                            prefill, prefill_queue, load)
    script = [str(FLOOR_NODE)] if node == "floor" else ["-m", "disque.server"]
    # --dump-before writes the profile up to the interpreter's exit to OUT.1
    # (the exit itself goes to OUT when the process ends).
    program = [*valgrind, f"--dump-before={EXIT_FUNCTION}", sys.executable, *script]
    # hz 1: the server cron's work (10 ticks a second by default) grows with
    # the run's wall-clock time, which under callgrind on a busy machine
    # varies by seconds; at one tick a second it no longer shows in the
    # per-command figure.  (The bus's own 100 ms cron does not follow hz.)
    node_args: list[str] = []
    user = password = None
    if as_user is not None:
        aclfile = root / f"bench-{requests}.acl"
        aclfile.write_text(f"user bench on >bench {as_user}\n")
        node_args = ["--aclfile", str(aclfile)]
        user = password = "bench"
    server = DisqueProcess(workdir, *NODE_ARGS, "--hz", "1", *node_args,
                           program=program).start(timeout=120)
    peers = [DisqueProcess(root / f"peer{i}-{requests}", *NODE_ARGS).start()
             for i in range(cluster - 1)]
    try:
        target = server
        if peers:
            from tests.support.cluster import join, wait_joined

            join([server, *peers])
            wait_joined([server, *peers], timeout=120)
            if measure == "peer":
                target = peers[0]
        if prefill:
            fill = ["ADDJOB", prefill_queue, PREFILL_BODY, "0", *prefill_options]
            run_benchmark(benchmark_command(target.port, fill, requests=prefill, pipeline=16),
                          timeout=1800)
        if load is not None:
            load(target.port, requests)
        else:
            run_benchmark(benchmark_command(target.port, command, requests=requests,
                                            pipeline=pipeline, user=user, password=password),
                          timeout=1800)
        try:
            raw_command(server.port, "SHUTDOWN", "NOSAVE", timeout=60)
        except ConnectionError:
            pass  # SHUTDOWN closes the connection instead of answering
        # callgrind prints its total when the process exits.
        wait_for(lambda: TOTAL.search(server.log_path.read_bytes()), 120,
                 interval=0.2, message="callgrind's total in the log")
    finally:
        server.kill()
        for peer in peers:
            peer.kill()
    counted = out.with_name(out.name + ".1")
    if not counted.exists():
        raise RuntimeError(f"callgrind dumped no profile before {EXIT_FUNCTION} ({counted}): "
                           f"the node did not exit normally, or {sys.executable} has no "
                           f"{EXIT_FUNCTION} symbol\n{server.log_text()[-2000:]}")
    return _totals(counted, profile)


#: The body of the jobs (or list elements) ``--prefill`` adds.
PREFILL_BODY = "x" * 100


def _count_redis(workdir: Path, out: Path, valgrind: list[str], command: list[str],
                 requests: int, pipeline: int, profile: str | None, prefill: int,
                 prefill_queue: str, load: Callable[[int, int], None] | None) -> dict[str, int]:
    """:func:`count_instructions` for a ``redis-server`` (the reference)."""
    from benchmarks.redis_tools import RedisProcess

    # hz 1 as for our node; its cron does less, but the same reasoning holds.
    server = RedisProcess(workdir, "--hz", "1", wrapper=tuple(valgrind)).start(timeout=120)
    try:
        if prefill:
            run_benchmark(benchmark_command(server.port, ["LPUSH", prefill_queue, PREFILL_BODY],
                                            requests=prefill, pipeline=16), timeout=1800)
        if load is not None:
            load(server.port, requests)
        else:
            run_benchmark(benchmark_command(server.port, command, requests=requests,
                                            pipeline=pipeline), timeout=1800)
        try:
            raw_command(server.port, "SHUTDOWN", "NOSAVE", timeout=60)
        except ConnectionError:
            pass
        assert server.proc is not None
        server.proc.wait(timeout=120)
    finally:
        server.kill()
    if not out.exists():
        raise RuntimeError(f"callgrind wrote no profile ({out})")
    return _totals(out, profile)


def _totals(counted: Path, profile: str | None) -> dict[str, int]:
    """The event totals of a callgrind profile (``Ir`` and, with the cache
    simulation, its misses); a copy of the profile goes to ``profile``."""
    data = counted.read_bytes()
    events, summary = EVENTS.search(data), SUMMARY_LINE.search(data)
    if events is None or summary is None:
        raise RuntimeError(f"no events or summary line in callgrind's profile {counted}")
    totals = dict(zip(events.group(1).decode().split(),
                      (int(v) for v in summary.group(1).split()), strict=True))
    if profile is not None:
        shutil.copyfile(counted, profile)
    return totals


def measure(command: list[str], small: int, large: int, pipeline: int,
            node: str = "disque", cluster: int = 1, side: str = "creator",
            profile: str | None = None, prefill: int = 0,
            prefill_queue: str = "q", prefill_options: tuple[str, ...] = (),
            as_user: str | None = None,
            load: Callable[[int, int], None] | None = None,
            cache_sim: bool = False) -> dict[str, Any]:
    if large <= small:
        raise ValueError("--large must be greater than --small")
    if prefill and prefill <= large:
        raise ValueError("--prefill must exceed --large (every request needs a job)")
    root = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        low = count_instructions(root, command, small, pipeline, node, cluster, side,
                                 profile and profile + ".small", prefill, prefill_queue,
                                 prefill_options, as_user, load, cache_sim)
        high = count_instructions(root, command, large, pipeline, node, cluster, side,
                                  profile, prefill, prefill_queue, prefill_options, as_user,
                                  load, cache_sim)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"command": command, "node": node, "cluster": cluster, "measured": side,
              "as_user": as_user,
              "pipeline": pipeline, "small": small, "prefill": prefill,
              "large": large, "instructions_small": low["Ir"], "instructions_large": high["Ir"],
              "per_command": (high["Ir"] - low["Ir"]) / (large - small)}
    if cache_sim:
        result["misses_per_command"] = {
            name: sum(high[e] - low[e] for e in events) / (large - small)
            for name, events in MISSES.items()}
    return result


def node_core() -> str:
    """The core a node started from this tree runs (``compiled (mypyc)``,
    ``interpreted (why)``), as its ``--version`` says."""
    out = subprocess.run([sys.executable, "-m", "disque.server", "--version"],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r"core: (.*)\)$", out.strip())
    return found.group(1) if found else f"unknown ({out.strip()!r})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="*", help="the command redis-benchmark sends")
    parser.add_argument("--pipeline", type=int, default=16)
    parser.add_argument("--small", type=int, default=4000)
    parser.add_argument("--large", type=int, default=20000)
    parser.add_argument("--node", choices=("disque", "floor", "redis"), default="disque",
                        help="floor: the node of benchmarks/floor_node.py; redis: "
                             "redis-server, the reference (XADD s * f body, RPOP q)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also count simulated cache misses and mispredicted "
                             "branches per command")
    parser.add_argument("--cluster", type=int, default=1, metavar="N",
                        help="join the measured node to N-1 plain nodes first")
    parser.add_argument("--measure", choices=("creator", "peer"), default="creator",
                        help="with --cluster: the node the commands go to, or a peer")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    parser.add_argument("--profile", metavar="PATH",
                        help="keep callgrind's profile of the --large run here, up to "
                             "the interpreter's exit (read it with callgrind_annotate PATH), "
                             "and the --small run's in PATH.small: their difference per "
                             "function is what the commands cost there")
    parser.add_argument("--prefill", type=int, default=0, metavar="N",
                        help="first add N jobs to --prefill-queue (for GETJOB)")
    parser.add_argument("--prefill-queue", default="q", metavar="QUEUE")
    parser.add_argument("--prefill-options", default="", metavar="OPTIONS",
                        help='ADDJOB options of the prefill, e.g. "PRIORITY 5"')
    parser.add_argument("--pickup", action="store_true",
                        help="instead of redis-benchmark: jobs handed one at a time to a "
                             "consumer blocked in GETJOB (no command)")
    parser.add_argument("--ack", type=int, metavar="N",
                        help="instead of redis-benchmark: ACKJOB of fetched jobs (the "
                             "prefill), N IDs per command; counts per job acked")
    parser.add_argument("--pickup-gate", action="store_true",
                        help="--pickup without the jobs: only the PING ordering each one")
    parser.add_argument("--as-user", metavar="RULES",
                        help='send the commands as a user with these ACL rules, e.g. '
                             '"~q* +@read +@write"')
    args = parser.parse_args(argv)
    missing = [tool for tool in ("valgrind", "redis-benchmark") if shutil.which(tool) is None]
    if missing:
        print(f"missing {', '.join(missing)}: install the Debian packages valgrind and "
              "redis-tools", file=sys.stderr)
        return 2
    if args.node == "redis" and (args.as_user or args.prefill_options or args.ack
                                 or args.pickup or args.pickup_gate):
        parser.error("--node redis takes a command, --prefill and --pipeline only")
    if args.cluster < 1 or (args.cluster > 1 and args.node != "disque"):
        parser.error("--cluster needs N >= 1, and a disque node")
    load: Callable[[int, int], None] | None = None
    if args.pickup or args.pickup_gate:
        if args.command:
            parser.error("--pickup and --pickup-gate send their own commands")
        jobs = not args.pickup_gate
        load = lambda port, count: pickups(port, count, jobs)  # noqa: E731
        args.command = ["(pickup)" if jobs else "(pickup gate: PING)"]
        args.pipeline = 1
    elif args.ack is not None:
        if args.command or args.ack < 1 or not args.prefill:
            parser.error("--ack N needs N >= 1 and --prefill, and sends its own commands")
        per_command, jobs, queue = args.ack, args.prefill, args.prefill_queue
        load = lambda port, count: acks(port, count, jobs, per_command, queue)  # noqa: E731
        args.command = [f"(ACKJOB of {per_command} fetched jobs)"]
        args.pipeline = 1
    elif not args.command:
        parser.error("a command is needed (or --pickup, --ack)")
    # A stale build would silently count the interpreted core.
    core = node_core() if args.node != "redis" else tool_version("redis-server")
    if args.node != "redis" and not core.startswith("compiled"):
        print(f"warning: the node will run {core}: these are not the compiled core's "
              "counts (rebuild: python3 -m pip install -e .)", file=sys.stderr)
    result = measure(args.command, args.small, args.large, args.pipeline, args.node,
                     args.cluster, args.measure, args.profile, args.prefill,
                     args.prefill_queue, tuple(args.prefill_options.split()), args.as_user,
                     load, args.cache_sim)
    where = f", {args.measure} of {args.cluster} nodes" if args.cluster > 1 else ""
    if args.as_user:
        where += f", as a user with {args.as_user!r}"
    print(f"{args.node} node{where}, {' '.join(args.command)} -P {args.pipeline}: "
          f"{result['per_command']:,.0f} instructions per command "
          f"(({result['instructions_large']:,} - {result['instructions_small']:,}) / "
          f"({args.large} - {args.small}) requests; core: {core})")
    for name, per_command in result.get("misses_per_command", {}).items():
        print(f"  {name}: {per_command:,.1f} per command (simulated)")
    result["core"] = core
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
