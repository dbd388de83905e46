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
from pathlib import Path

from faults import EXIT_SKIPPED, netns
from faults.nemesis import KINDS
from faults.report import details, table, timeline
from faults.run import Schedule, run_schedule
from faults.workload import WorkloadConfig


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", default="partition,pause,kill",
                        help=f"comma-separated schedules to run, one cluster each "
                             f"(of: {', '.join(KINDS)}; default partition,pause,kill)")
    parser.add_argument("--time", type=float, default=60.0,
                        help="seconds of faults per schedule (default 60)")
    parser.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
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
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for report.json, history-*.json, timeline.png and "
                             "the nodes' logs (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    if args.nodes < 3 or args.nodes > 250:
        parser.error("--nodes must be between 3 and 250")
    return args


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
    for kind in args.kinds:
        schedule = Schedule(kind, args.time, nodes=args.nodes,
                            node_timeout_ms=args.node_timeout,
                            drain_timeout_s=args.drain_timeout, gc_timeout_s=args.gc_timeout,
                            workload=WorkloadConfig(retry_s=args.retry,
                                                    max_jobs=args.max_jobs, seed=args.seed))
        outcome = run_schedule(schedule, out / kind, log=lambda m: print(m, flush=True))
        outcome.history.save(out / f"history-{kind}.json")
        print(details(outcome), flush=True)
        outcomes.append(outcome)
    print()
    print(table(outcomes))
    png = timeline(outcomes, out / "timeline.png")
    print(f"\ntimeline: {png}" if png else "\ntimeline: not drawn (matplotlib not installed)")
    report = {o.schedule.kind: {**o.result.to_json(), "notes": o.notes,
                                "faults_applied": [f.description for f in o.history.faults]}
              for o in outcomes}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    defects = sum(len(o.result.defects()) for o in outcomes)
    print(f"{'DEFECTS FOUND' if defects else 'no defects'}: see {out / 'report.json'}")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
