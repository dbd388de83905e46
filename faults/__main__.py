"""``python3 -m faults``: run fault schedules against a fresh cluster each, and report.

The process re-executes itself inside a network namespace of its own
(``unshare -n``) before doing anything; exit status 77 means it could not
(no privileges or no nft) and says why, 1 means the checker found defects.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from faults import EXIT_SKIPPED, disk, netns
from faults.nemesis import KINDS, SINGLE_KINDS
from faults.nodes import faketime_library
from faults.report import details, memory_table, table, timeline
from faults.run import Schedule, run_schedule
from faults.workload import WorkloadConfig


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", default="partition,pause,kill",
                        help=f"comma-separated schedules to run, one cluster each "
                             f"(of: {', '.join(KINDS)}; default partition,pause,kill). "
                             f"mixed: overlapping faults of every kind; soak: one at a "
                             f"time with a quiet minute between, for long runs; none: the "
                             f"workload without faults")
    parser.add_argument("--time", type=float, default=60.0,
                        help="seconds of faults per schedule (default 60)")
    parser.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    parser.add_argument("--replicate", default=None,
                        help="the jobs' REPLICATE, drawn from this comma-separated list "
                             "(default 2,3; 3 with 5 nodes or more)")
    parser.add_argument("--clock-jump", default="20,90",
                        help="clock faults jump a node's wall clock by a number of seconds "
                             "between these two, forward or back (default 20,90)")
    parser.add_argument("--node-timeout", type=int, default=2000,
                        help="cluster-node-timeout in ms (default 2000)")
    parser.add_argument("--retry", type=int, default=3, help="jobs' RETRY in s (default 3)")
    parser.add_argument("--max-jobs", type=int, default=100_000,
                        help="stop producing after this many ADDJOBs per schedule")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="after healing, seconds to consume every job (default 60)")
    parser.add_argument("--gc-timeout", type=float, default=200.0,
                        help="then seconds for the ACK GC to empty the nodes (default 200: "
                             "the GC's retry backoff reaches 180 s)")
    parser.add_argument("--groups", type=int, default=0,
                        help="ordered groups: this many group keys, each owned by one "
                             "producer, whose jobs are added through disque.Client with "
                             "route_groups (default 0: no job has a group)")
    parser.add_argument("--group-share", type=float, default=0.5,
                        help="with --groups, the share of the jobs that get a group "
                             "(default 0.5)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=None,
                        help="pause in s between a producer's ADDJOBs (default 0.02; "
                             "0.1 for soak)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for report.json, history-*.json, timeline.png and "
                             "the nodes' logs (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    if args.groups < 0 or not 0 <= args.group_share <= 1:
        parser.error("--groups must be >= 0 and --group-share between 0 and 1")
    if args.nodes < 3 or args.nodes > 250:
        parser.error("--nodes must be between 3 and 250")
    try:
        replicate = args.replicate or ("3" if args.nodes >= 5 else "2,3")
        args.replicate = tuple(int(r) for r in replicate.split(","))
        low, high = (int(v) for v in args.clock_jump.split(","))
        args.clock_jump = (low, high)
    except ValueError:
        parser.error("--replicate and --clock-jump take comma-separated integers")
    if not all(1 <= r <= args.nodes for r in args.replicate):
        parser.error(f"--replicate must be between 1 and --nodes ({args.nodes})")
    return args


def unavailable() -> dict[str, str]:
    """The fault kinds this machine cannot apply, with why."""
    missing = {}
    reason = disk.unavailable_reason()
    if reason is not None:
        missing["disk"] = f"disk faults: {reason}"
    if faketime_library() is None:
        missing["clock"] = ("clock faults: libfaketime not found (Debian package "
                            "faketime)")
    return missing


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    reason = netns.enter("faults", argv)
    if reason is not None:
        print(f"faults: skipped: {reason}", file=sys.stderr)
        return EXIT_SKIPPED
    if args.out is None:
        with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
            return run(args, Path(tmp))
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args, args.out)


def run(args: argparse.Namespace, out: Path) -> int:
    outcomes = []
    missing = unavailable()
    skipped = {}
    for kind in args.kinds:
        if kind in SINGLE_KINDS and kind in missing:
            print(f"[{kind}] skipped: {missing[kind]}", flush=True)
            skipped[kind] = missing[kind]
            continue
        interval = args.rate if args.rate is not None else 0.1 if kind == "soak" else 0.02
        schedule = Schedule(kind, args.time, nodes=args.nodes,
                            node_timeout_ms=args.node_timeout,
                            drain_timeout_s=args.drain_timeout, gc_timeout_s=args.gc_timeout,
                            clock_jump_s=args.clock_jump, unavailable=missing,
                            workload=WorkloadConfig(retry_s=args.retry, max_jobs=args.max_jobs,
                                                    seed=args.seed, replicate=args.replicate,
                                                    produce_interval_s=interval,
                                                    groups=args.groups,
                                                    group_fraction=args.group_share))
        outcome = run_schedule(schedule, out / kind, log=lambda m: print(m, flush=True))
        if kind in ("mixed", "soak"):
            outcome.notes += [f"not drawn: {why}" for why in missing.values()]
        outcome.history.save(out / f"history-{kind}.json")
        print(details(outcome), flush=True)
        outcomes.append(outcome)
    print()
    print(table(outcomes))
    memory = memory_table(outcomes)
    if memory:
        print()
        print(memory)
    png = timeline(outcomes, out / "timeline.png") if outcomes else None
    print(f"\ntimeline: {png}" if png else "\ntimeline: not drawn (matplotlib not installed)")
    report = {o.schedule.kind: {**o.result.to_json(), "notes": o.notes,
                                "nodes": o.schedule.nodes,
                                "replicate": list(o.schedule.workload.replicate),
                                "fault_kinds": dict(Counter(f.kind for f in o.history.faults)),
                                "faults_applied": [f.description for f in o.history.faults]}
              for o in outcomes}
    report.update({kind: {"skipped": why} for kind, why in skipped.items()})
    (out / "report.json").write_text(json.dumps(report, indent=1))
    defects = sum(len(o.result.defects()) for o in outcomes)
    print(f"{'DEFECTS FOUND' if defects else 'no defects'}: see {out / 'report.json'}")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
