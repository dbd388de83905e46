"""The checker: what the history and the healed cluster's state say.

Safety (a failure here is a defect of the node):

* **lost**: a job whose synchronous ADDJOB returned an ID was never
  delivered, although not all its copies were lost for good.  The
  producer asks the node for the job's copies (SHOW ``nodes-delivered``)
  right after the ADDJOB; the loss is excused only when every one of those
  nodes lost its copies for good afterwards (SIGKILL without AOF).  When the
  node did not say, a loss is excused if REPLICATE nodes were wiped after
  the ADDJOB started (generous).  Jobs with a TTL may expire undelivered:
  they are held to their time bounds instead.
* **delivered after GC**: a GETJOB that started after the GC observer saw
  the acked job gone from every node returned it.
* **phantom**: a delivered job that no ADDJOB sent, or with another body.
* **duplicate IDs**: two ADDJOBs answered with the same ID.
* **time bounds** (a node's timers, whatever its wall clock does): a job
  delivered before its DELAY passed, delivered after its TTL passed (1%
  and a second of slack), or delivered again by a requeue less than RETRY
  (less the 250 ms jitter and 250 ms of slack) after its ADDJOB without a
  NACK in between.  A requeue by another copy may come earlier than RETRY
  after a *delivery* (that copy counts from when the job was queued), so
  the RETRY bound is taken from the ADDJOB, where it always holds.
* a node that does not **start again** after a kill (its AOF refused).
* after healing: a job **queued on two nodes** once the cluster settled,
  jobs **left on a node** after every job was delivered and acked (a leaked
  acked job is one still there in state ``acked``), ``registered_jobs`` not
  back to 0.

Allowed by the spec (at-least-once), counted and classified: duplicates.
Each redelivery is put down, from the nodes' counters on the two
deliveries (``nacks``, ``additional-deliveries``: a copy's requeues are
broadcast, so the counters of any copy move) and the fault log, to: a NACK;
a requeue after RETRY because the consumer crashed, or was slower than
RETRY; a requeue of a copy that had not heard of the ACK yet ("after
ack": the spec's best-effort ACK); the fault(s) active between the two
deliveries; or, when none applies, "other: requeued" (a counter moved) or
"other: queued twice" (none did: two copies were queued at once).  Asynchronous ADDJOBs never
delivered are reported but not counted as lost (ASYNC promises nothing
once the node dies before replicating).

Ordered groups (``--groups``): deliveries out of add order and overlapping
deliveries of one group, counted per cause (the faults in force), and a
defect when no fault explains them: see :mod:`faults.groups`.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from faults.groups import GroupResult, check_groups
from faults.history import FAIL, INFO, OK, Fault, History, Op

#: Slack on the time bounds: a GETJOB's start and end bracket the delivery.
JITTER_S = 0.25
SLACK_S = 0.25


@dataclass
class FinalState:
    """What the nodes hold after healing and draining."""

    #: node -> registered_jobs from INFO.
    registered_jobs: dict[str, int] = field(default_factory=dict)
    #: node -> [(job id, state)] still on the node.
    jobs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: job id -> nodes where it was still queued at the end of the settle window.
    queued_twice: dict[str, list[str]] = field(default_factory=dict)
    #: For the first few of them, what each node holding one says (SHOW:
    #: state, node list, group, next requeue): why nobody stepped aside.
    queued_twice_shown: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Seconds it took for no job to be queued twice (None: never within the window).
    settle_s: float | None = 0.0
    #: Memory samples: {"t": seconds, "phase": ..., node: {rss, used_memory, ...}}.
    memory: list[dict[str, Any]] = field(default_factory=list)
    #: Nodes that did not come back (a restart refused): defects.
    errors: list[str] = field(default_factory=list)


@dataclass
class Result:
    ops: int = 0
    adds: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0
    delivered_jobs: int = 0
    acks_ok: int = 0
    lost: list[str] = field(default_factory=list)
    lost_excused: list[str] = field(default_factory=list)
    #: How the lost jobs were excused: by their known copies, or by counting kills.
    excused_by: Counter[str] = field(default_factory=Counter)
    async_undelivered: list[str] = field(default_factory=list)
    expired_undelivered: list[str] = field(default_factory=list)
    delivered_after_gc: list[str] = field(default_factory=list)
    delivered_after_ack: int = 0
    phantom: list[str] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    early_delivery: list[str] = field(default_factory=list)
    late_delivery: list[str] = field(default_factory=list)
    early_requeue: list[str] = field(default_factory=list)
    duplicates: Counter[str] = field(default_factory=Counter)
    queued_twice: dict[str, list[str]] = field(default_factory=dict)
    queued_twice_shown: dict[str, dict[str, str]] = field(default_factory=dict)
    leaked: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    registered_jobs: dict[str, int] = field(default_factory=dict)
    max_unavailable_s: float = 0.0
    faults: int = 0
    faults_with_effect: int = 0
    #: Pairs of faults that were active at the same time (descriptions).
    overlaps: list[tuple[str, str]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Ordered groups: order and exclusivity (faults.groups).
    groups: GroupResult = field(default_factory=GroupResult)

    @property
    def duplicate_count(self) -> int:
        return sum(self.duplicates.values())

    def defects(self) -> list[str]:
        """Violations of what the node promises, one line each."""
        found = list(self.errors)
        listed = (
            (self.lost, "acknowledged jobs never delivered"),
            (self.delivered_after_gc, "deliveries after a completed ACK"),
            (self.phantom, "deliveries of jobs never added"),
            (self.duplicate_ids, "IDs answered to two ADDJOBs"),
            (self.early_delivery, "jobs delivered before their DELAY"),
            (self.late_delivery, "jobs delivered after their TTL"),
            (self.early_requeue, "jobs requeued sooner than RETRY"),
        )
        for items, what in listed:
            if items:
                found.append(f"{len(items)} {what}: {items[:5]}")
        if self.queued_twice:
            found.append(f"{len(self.queued_twice)} jobs queued on several nodes after "
                         f"healing: {dict(list(self.queued_twice.items())[:3])}")
        if any(self.leaked.values()):
            found.append(f"jobs left on nodes after all were acked: "
                         f"{ {n: j[:3] for n, j in self.leaked.items() if j} }")
        if any(self.registered_jobs.values()):
            found.append(f"registered_jobs not back to 0: {self.registered_jobs}")
        g = self.groups
        for rule, what, counts in (("out of order", "out-of-order deliveries", g.out_of_order),
                                   ("overlapping", "overlapping deliveries", g.overlapping)):
            if counts["none"]:
                found.append(f"{counts['none']} {what} of a group with no fault in force: "
                             f"{[u for u in g.unexplained if u.startswith(rule)][:3]}")
        if g.wrong_key:
            found.append(f"{len(g.wrong_key)} deliveries with another group key: "
                         f"{g.wrong_key[:5]}")
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops, "adds": dict(self.adds), "deliveries": self.deliveries,
            "delivered_jobs": self.delivered_jobs, "acks_ok": self.acks_ok,
            "lost": self.lost, "lost_excused": self.lost_excused,
            "excused_by": dict(self.excused_by),
            "async_undelivered": self.async_undelivered,
            "expired_undelivered": self.expired_undelivered,
            "delivered_after_gc": self.delivered_after_gc,
            "delivered_after_ack": self.delivered_after_ack, "phantom": self.phantom,
            "duplicate_ids": self.duplicate_ids, "early_delivery": self.early_delivery,
            "late_delivery": self.late_delivery, "early_requeue": self.early_requeue,
            "duplicates": dict(self.duplicates), "duplicate_count": self.duplicate_count,
            "queued_twice": self.queued_twice, "queued_twice_shown": self.queued_twice_shown,
            "leaked": {n: [list(j) for j in jobs] for n, jobs in self.leaked.items()},
            "registered_jobs": self.registered_jobs,
            "max_unavailable_s": round(self.max_unavailable_s, 2),
            "faults": self.faults, "faults_with_effect": self.faults_with_effect,
            "overlaps": [list(pair) for pair in self.overlaps],
            "memory": self.memory, "errors": self.errors,
            "groups": self.groups.to_json(),
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

    ids = Counter(o.job_id for o in adds if o.outcome == OK)
    result.duplicate_ids = sorted(job_id for job_id, n in ids.items() if job_id and n > 1)
    _check_lost(result, adds, gets, history.faults)
    for job_id, delivered in gets.items():
        # In the order the replies came: a GETJOB blocked since before an
        # earlier delivery may return after it.
        delivered.sort(key=lambda o: o.end)
        add = body_of_add.get(delivered[0].body)
        # The client sends an ADDJOB whose reply it lost to the next node by
        # rank ("resent"): the first send may have added a job too, under
        # an ID nobody answered.
        if add is None or (add.outcome == OK and add.job_id != job_id
                           and not add.extra.get("resent")):
            result.phantom.append(job_id)
        _check_after_ack(result, job_id, delivered, by_job[job_id])
        if add is not None and add.outcome == OK:
            _check_time_bounds(result, job_id, add, delivered, by_job[job_id])
        _classify_duplicates(result, delivered, by_job[job_id], history.faults)

    result.queued_twice = dict(final.queued_twice)
    result.queued_twice_shown = dict(final.queued_twice_shown)
    result.leaked = {n: jobs for n, jobs in final.jobs.items() if jobs}
    result.registered_jobs = dict(final.registered_jobs)
    result.max_unavailable_s = _max_unavailable(history)
    result.faults = len(history.faults)
    result.faults_with_effect = sum(1 for f in history.faults if f.effects)
    result.overlaps = overlapping(history.faults)
    result.memory = list(final.memory)
    result.errors = list(final.errors)
    result.groups = check_groups(history)
    return result


def overlapping(faults: list[Fault]) -> list[tuple[str, str]]:
    """Pairs of faults active at the same time."""
    pairs = []
    for a, b in itertools.combinations(sorted(faults, key=lambda f: f.start), 2):
        a_end = a.end if a.end is not None else float("inf")
        if b.start < a_end:
            pairs.append((f"{a.start:.1f}s {a.kind}: {a.description}",
                          f"{b.start:.1f}s {b.kind}: {b.description}"))
    return pairs


def _check_lost(result: Result, adds: list[Op], gets: dict[str, list[Op]],
                faults: list[Fault]) -> None:
    for op in adds:
        if op.outcome != OK or op.job_id in gets:
            continue
        if op.extra.get("async"):
            result.async_undelivered.append(op.job_id or "")
            continue
        if op.extra.get("ttl"):
            result.expired_undelivered.append(op.job_id or "")
            continue
        wiped = {n for f in faults if f.lost_for_good and f.start >= op.start for n in f.nodes}
        copies = op.extra.get("copies")
        if copies:
            if set(copies) <= wiped:
                result.lost_excused.append(op.job_id or "")
                result.excused_by["every copy wiped"] += 1
                continue
        elif len(wiped) >= int(op.extra.get("replicate", 1)):
            result.lost_excused.append(op.job_id or "")
            result.excused_by["REPLICATE nodes wiped (copies unknown)"] += 1
            continue
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


def _check_time_bounds(result: Result, job_id: str, add: Op, delivered: list[Op],
                       ops: dict[str, list[Op]]) -> None:
    delay = float(add.extra.get("delay", 0))
    ttl = float(add.extra.get("ttl", 0))
    retry = float(add.extra.get("retry", 0))
    if delay and delivered[0].end < add.start + delay - SLACK_S:
        result.early_delivery.append(job_id)
    if ttl and any(get.start > add.end + ttl * 1.01 + 1.0 for get in delivered):
        result.late_delivery.append(job_id)
    if retry and len(delivered) > 1:
        again = delivered[1]
        # A NACK requeues at once: its counter on the delivery says so even
        # when the GETJOB that got it was sent before the NACK.
        nacked = int(again.extra.get("nacks", 0)) > 0 or any(
            o.start < again.end and o.outcome in (OK, INFO) for o in ops["nack"])
        if not nacked and again.end < add.start + delay + retry - JITTER_S - SLACK_S:
            result.early_requeue.append(job_id)


def _classify_duplicates(result: Result, delivered: list[Op], ops: dict[str, list[Op]],
                         faults: list[Fault]) -> None:
    for before, again in itertools.pairwise(delivered):
        def between(kind: str, outcomes: tuple[str, ...] = (OK, INFO, FAIL),
                    b: Op = before, a: Op = again) -> bool:
            return any(b.end <= o.start <= a.start and o.outcome in outcomes
                       for o in ops[kind])

        nacks = int(again.extra.get("nacks", 0)) - int(before.extra.get("nacks", 0))
        requeues = (int(again.extra.get("additional_deliveries", 0))
                    - int(before.extra.get("additional_deliveries", 0)))
        acked_before = any(o.outcome == OK and o.end <= again.start for o in ops["ack"])
        # The faults in force when the job was delivered again, or else the
        # ones that came and went since the delivery before.
        active = sorted({f.kind for f in faults if f.start <= again.start and (
            f.end is None or f.end >= again.start)}) or sorted({
            f.kind for f in faults
            if f.start <= again.start and (f.end is None or f.end >= before.end)})
        if nacks > 0 or between("nack", (OK, INFO)):
            cause = "nack"
        elif between("crash"):
            cause = "consumer crashed"
        elif acked_before:
            cause = "after ack"
        elif requeues > 0 and before.extra.get("role") == "slow":
            cause = "slow consumer"
        elif active:
            cause = "+".join(active)
        else:
            cause = "other: requeued" if requeues > 0 else "other: queued twice"
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
