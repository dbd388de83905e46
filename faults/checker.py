"""The checker: what the history and the healed cluster's state say.

Safety (a failure here is a defect of the node):

* **lost**: a job whose synchronous ADDJOB returned an ID was never
  delivered, although fewer than REPLICATE nodes lost their copies for good
  (SIGKILL without AOF).  Every such kill after the ADDJOB started is
  counted against the job, so the excuse is generous, never strict.
* **delivered after GC**: a GETJOB that started after the GC observer saw
  the acked job gone from every node returned it.
* **phantom**: a delivered job that no ADDJOB sent, or with another body.
* after healing: a job **queued on two nodes** once the cluster settled,
  jobs **left on a node** after every job was delivered and acked (a leaked
  acked job is one still there in state ``acked``), ``registered_jobs`` not
  back to 0.

Allowed by the spec (at-least-once), counted and classified: duplicates.
Each redelivery is put down to a NACK, to RETRY expiry (the consumer
crashed, or was slower than RETRY), to an ACK that had not reached every
copy yet ("after ack": the spec's best-effort ACK), or to the fault that
was active, and "other" when none applies.  Asynchronous ADDJOBs that were
never delivered are reported but not counted as lost (ASYNC promises
nothing once the node dies before replicating).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from faults.history import FAIL, INFO, OK, Fault, History, Op


@dataclass
class FinalState:
    """What the nodes hold after healing and draining."""

    #: node -> registered_jobs from INFO.
    registered_jobs: dict[str, int] = field(default_factory=dict)
    #: node -> [(job id, state)] still on the node.
    jobs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: job id -> nodes where it was still queued at the end of the settle window.
    queued_twice: dict[str, list[str]] = field(default_factory=dict)
    #: Seconds it took for no job to be queued twice (None: never within the window).
    settle_s: float | None = 0.0


@dataclass
class Result:
    ops: int = 0
    adds: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0
    delivered_jobs: int = 0
    acks_ok: int = 0
    lost: list[str] = field(default_factory=list)
    lost_excused: list[str] = field(default_factory=list)
    async_undelivered: list[str] = field(default_factory=list)
    delivered_after_gc: list[str] = field(default_factory=list)
    delivered_after_ack: int = 0
    phantom: list[str] = field(default_factory=list)
    duplicates: Counter[str] = field(default_factory=Counter)
    queued_twice: dict[str, list[str]] = field(default_factory=dict)
    leaked: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    registered_jobs: dict[str, int] = field(default_factory=dict)
    max_unavailable_s: float = 0.0
    faults: int = 0
    faults_with_effect: int = 0

    @property
    def duplicate_count(self) -> int:
        return sum(self.duplicates.values())

    def defects(self) -> list[str]:
        """Violations of what the node promises, one line each."""
        found = []
        if self.lost:
            found.append(f"{len(self.lost)} acknowledged jobs never delivered: "
                         f"{self.lost[:5]}")
        if self.delivered_after_gc:
            found.append(f"{len(self.delivered_after_gc)} deliveries after a completed ACK: "
                         f"{self.delivered_after_gc[:5]}")
        if self.phantom:
            found.append(f"{len(self.phantom)} deliveries of jobs never added: "
                         f"{self.phantom[:5]}")
        if self.queued_twice:
            found.append(f"{len(self.queued_twice)} jobs queued on several nodes after "
                         f"healing: {dict(list(self.queued_twice.items())[:3])}")
        if any(self.leaked.values()):
            found.append(f"jobs left on nodes after all were acked: "
                         f"{ {n: j[:3] for n, j in self.leaked.items() if j} }")
        if any(self.registered_jobs.values()):
            found.append(f"registered_jobs not back to 0: {self.registered_jobs}")
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops, "adds": dict(self.adds), "deliveries": self.deliveries,
            "delivered_jobs": self.delivered_jobs, "acks_ok": self.acks_ok,
            "lost": self.lost, "lost_excused": self.lost_excused,
            "async_undelivered": self.async_undelivered,
            "delivered_after_gc": self.delivered_after_gc,
            "delivered_after_ack": self.delivered_after_ack, "phantom": self.phantom,
            "duplicates": dict(self.duplicates), "duplicate_count": self.duplicate_count,
            "queued_twice": self.queued_twice,
            "leaked": {n: [list(j) for j in jobs] for n, jobs in self.leaked.items()},
            "registered_jobs": self.registered_jobs,
            "max_unavailable_s": round(self.max_unavailable_s, 2),
            "faults": self.faults, "faults_with_effect": self.faults_with_effect,
            "defects": self.defects(),
        }


def check(history: History, final: FinalState) -> Result:
    result = Result(ops=sum(1 for o in history.ops if o.kind != "gc"))
    adds = [o for o in history.ops if o.kind == "add"]
    body_of_add = {o.body: o for o in adds}
    gets: dict[str, list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.kind == "get" and op.outcome == OK and op.job_id:
            gets[op.job_id].append(op)
    by_job: dict[str, dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
    for op in history.ops:
        if op.job_id and op.kind in ("ack", "nack", "crash", "gc"):
            by_job[op.job_id][op.kind].append(op)

    for op in adds:
        label = "async" if op.extra.get("async") else "sync"
        result.adds[f"{label} {op.outcome}"] += 1
    result.deliveries = sum(len(v) for v in gets.values())
    result.delivered_jobs = len(gets)
    result.acks_ok = sum(1 for o in history.ops if o.kind == "ack" and o.outcome == OK)

    _check_lost(result, adds, gets, history.faults)
    for job_id, delivered in gets.items():
        delivered.sort(key=lambda o: o.start)
        add = body_of_add.get(delivered[0].body)
        if add is None or (add.outcome == OK and add.job_id != job_id):
            result.phantom.append(job_id)
        _check_after_ack(result, job_id, delivered, by_job[job_id])
        retry = float(add.extra.get("retry", 0)) if add is not None else 0.0
        _classify_duplicates(result, delivered, by_job[job_id], history.faults, retry)

    result.queued_twice = dict(final.queued_twice)
    result.leaked = {n: jobs for n, jobs in final.jobs.items() if jobs}
    result.registered_jobs = dict(final.registered_jobs)
    result.max_unavailable_s = _max_unavailable(history)
    result.faults = len(history.faults)
    result.faults_with_effect = sum(1 for f in history.faults if f.effects)
    return result


def _check_lost(result: Result, adds: list[Op], gets: dict[str, list[Op]],
                faults: list[Fault]) -> None:
    for op in adds:
        if op.outcome != OK or op.job_id in gets:
            continue
        if op.extra.get("async"):
            result.async_undelivered.append(op.job_id or "")
            continue
        wiped = {n for f in faults if f.lost_for_good and f.start >= op.start for n in f.nodes}
        if len(wiped) >= int(op.extra.get("replicate", 1)):
            result.lost_excused.append(op.job_id or "")
        else:
            result.lost.append(op.job_id or "")


def _check_after_ack(result: Result, job_id: str, delivered: list[Op],
                     ops: dict[str, list[Op]]) -> None:
    gc_done = min((o.end for o in ops["gc"]), default=None)
    acked = min((o.end for o in ops["ack"] if o.outcome == OK), default=None)
    for get in delivered:
        if gc_done is not None and get.start > gc_done:
            result.delivered_after_gc.append(job_id)
        elif acked is not None and get.start > acked:
            result.delivered_after_ack += 1


def _classify_duplicates(result: Result, delivered: list[Op], ops: dict[str, list[Op]],
                         faults: list[Fault], retry: float) -> None:
    for before, again in itertools.pairwise(delivered):
        def between(kind: str, outcomes: tuple[str, ...] = (OK, INFO, FAIL),
                    b: Op = before, a: Op = again) -> bool:
            return any(b.end <= o.start <= a.start and o.outcome in outcomes
                       for o in ops[kind])

        acked_before = any(o.outcome == OK and o.end <= again.start for o in ops["ack"])
        if between("nack", (OK, INFO)):
            cause = "nack"
        elif between("crash") or (not acked_before and again.start - before.end >= retry * 0.9):
            cause = "retry"
        elif acked_before:
            cause = "after ack"
        else:
            active = [f.kind for f in faults
                      if f.start <= again.end and (f.end is None or f.end >= before.start)]
            cause = active[0] if active else "other"
        result.duplicates[cause] += 1


def _max_unavailable(history: History) -> float:
    """Longest time without a successful synchronous ADDJOB completing, while producing."""
    start = history.marks.get("workload", 0.0)
    stop = history.marks.get("stopped", history.now())
    times = sorted(o.end for o in history.ops
                   if o.kind == "add" and o.outcome == OK and not o.extra.get("async")
                   and start <= o.end <= stop)
    # Producers stop early once they ran out of jobs: that is no unavailability,
    # so the window ends at the last ADDJOB attempt.
    last_attempt = max((o.start for o in history.ops if o.kind == "add"), default=stop)
    end = min(stop, max(last_attempt, times[-1] if times else start))
    points = [start, *times, end]
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)
