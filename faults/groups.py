"""The checker's rules for ordered groups (``ADDJOB ... GROUP``).

docs/EXTENSIONS.md ("Ordered groups", "Ordered groups in a cluster")
promises, per queue and key: a job of the group goes out only after every
older job of the group was settled (or before it in the same GETJOB
reply), and never while another job of the group is out; delivery stays
at least once.  Without faults that holds across the cluster; after a node
failure, and during a partition, both can break for a while, as the docs
say when.  The history cannot see inside a node, so each rule counts only
what certainly happened, from the client's side:

* **add order**: a group belongs to one producer, which sends each ADDJOB
  after the previous one's reply; the group's order is the order of its
  ADDJOBs that returned an ID (``seq``).  Jobs whose ADDJOB failed or got
  no answer, and jobs of a lost reply re-sent elsewhere by the client
  (another ID for the same body), have no place in it: they count for
  overlaps only.
* **out of order**: a delivery (any, first or again) of job B such that
  some job A older than B in the add order had no ACK begun before the
  GETJOB that handed out B returned (no ACK at all, or its first ACK,
  answered or not, started after that reply), unless A came before B in
  the same reply.  An ACK begun before the reply may have settled A in
  time, so it excuses; a NACK does not (A is the group's next job again).
  Counted once per delivery.
* **overlapping**: two deliveries of different jobs of one group whose
  *holds* intersect, the jobs of one GETJOB reply excepted (a COUNT n
  batch of one group is one hold).  A delivery's hold is the time its node
  certainly had the job out: from the GETJOB's reply to the first of the
  start of its consumer's ACK or NACK of it and the end of its lease (the
  GETJOB's start plus ``next-requeue-within``, WITHLEASE; RETRY where the
  lease is not known): after that the node queues the job again, and
  handing it out again is at-least-once, not a second consumer of the
  group.  A consumer that crashed holds it until its lease ends.  A late
  ACK ends it too: one begun after the GETJOB by the consumer of an
  earlier delivery of the job whose lease may have ended before this one's
  reply (the node handed the job out again, then that ACK settled it and
  released the group, while the later consumer still works on it:
  at-least-once on one node).  An ACK by the consumer of a later delivery,
  or of an earlier one still in its lease, does not: that delivery came
  from a second node serving the group.  Counted once per pair of
  deliveries.

Each violation is put down to the faults in force during it or ended less
than a *requeue window* before it: RETRY, plus 2 s per copy that ranks
before the last one (a copy's wait by rank, rule 2 of "In a cluster"),
plus 1 s (WILLQUEUE's 500 ms and the jitter), the time a group takes to be
queued again after its node failed or a partition healed.  A violation
with no fault in force or recently ended (``none``) is a defect.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from faults.history import INFO, OK, Fault, History, Op

#: Seconds per better ranked copy a copy waits before queueing a group
#: (disque/groups.py RANK_WAIT_MS), and WILLQUEUE's warning plus the jitter.
RANK_WAIT_S = 2.0
WILLQUEUE_AND_JITTER_S = 1.0
#: Kept in the report: the first violations of each rule, and every one
#: with no fault in force.
EXAMPLES = 20


@dataclass
class GroupResult:
    """What the group rules found (``Result.groups``)."""

    keys: int = 0
    #: Jobs of groups whose ADDJOB returned an ID, and those among them the
    #: client sent again to another node after losing a reply.
    jobs: int = 0
    resent: int = 0
    deliveries: int = 0
    #: Groups with a delivery, and those whose jobs went out (first
    #: deliveries, in the order the replies came) in add order.
    delivered: int = 0
    in_order: int = 0
    out_of_order: Counter[str] = field(default_factory=Counter)
    overlapping: Counter[str] = field(default_factory=Counter)
    #: Deliveries whose GETJOB ... WITHGROUP named another group (or none)
    #: than the job's ADDJOB: defects.
    wrong_key: list[str] = field(default_factory=list)
    #: One line per violation kept (see EXAMPLES).
    examples: list[str] = field(default_factory=list)
    #: The violations with no fault in force: defects.
    unexplained: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"keys": self.keys, "jobs": self.jobs, "resent": self.resent,
                "deliveries": self.deliveries, "delivered": self.delivered,
                "in_order": self.in_order, "out_of_order": dict(self.out_of_order),
                "overlapping": dict(self.overlapping), "wrong_key": self.wrong_key,
                "examples": self.examples,
                "unexplained": self.unexplained}


@dataclass
class Delivery:
    get: Op
    job: str
    group: str
    #: The job's place in its group's add order (None: it has none).
    seq: int | None
    #: When the node certainly had the job out (empty when ``end <= start``).
    hold_start: float
    hold_end: float

    @property
    def reply(self) -> tuple[str, float]:
        """The GETJOB reply it came in (a process's GETJOBs are sequential)."""
        return self.get.process, self.get.start

    def text(self) -> str:
        place = "" if self.seq is None else f" (#{self.seq})"
        return (f"{self.job}{place} from {self.get.node} to {self.get.process} at "
                f"{self.get.end:.2f}s")


def check_groups(history: History) -> GroupResult:
    result = GroupResult()
    adds = [o for o in history.ops if o.kind == "add" and o.extra.get("group")]
    if not adds:
        return result
    result.keys = len({o.extra["group"] for o in adds})
    result.jobs = sum(1 for o in adds if o.outcome == OK)
    result.resent = sum(1 for o in adds if o.extra.get("resent"))
    add_of_body = {o.body: o for o in adds}
    # Each group's jobs in add order, and the window of each group.
    order: dict[str, list[str]] = defaultdict(list)
    window: dict[str, float] = defaultdict(float)
    for op in sorted(adds, key=lambda o: int(o.extra.get("seq", 0))):
        group = str(op.extra["group"])
        if op.outcome == OK and op.job_id:
            order[group].append(op.job_id)
        window[group] = max(window[group], requeue_window(op))
    place = {job: i for jobs in order.values() for i, job in enumerate(jobs)}
    first_ack: dict[str, float] = {}
    settles: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.kind in ("ack", "nack") and op.job_id and op.outcome in (OK, INFO):
            if op.kind == "ack":
                first_ack[op.job_id] = min(first_ack.get(op.job_id, op.start), op.start)
            settles[(op.process, op.job_id)].append(op)
    for ops in settles.values():
        ops.sort(key=lambda o: o.start)
    # Who had each job: the start of each GETJOB, its process, and the
    # earliest its lease can have ended.
    taken: dict[str, list[tuple[float, str, float]]] = defaultdict(list)
    for op in history.ops:
        if op.kind == "get" and op.outcome == OK and op.job_id:
            lease_ms = op.extra.get("lease_ms")
            lease = float("inf") if lease_ms is None else float(lease_ms) / 1000
            taken[op.job_id].append((op.start, op.process, op.start + lease))

    by_group: dict[str, list[Delivery]] = defaultdict(list)
    for get in history.ops:
        if get.kind != "get" or get.outcome != OK or not get.job_id:
            continue
        add = add_of_body.get(get.body)
        if add is None:
            continue
        group = str(add.extra["group"])
        if "group" in get.extra and get.extra["group"] != group:
            result.wrong_key.append(f"{get.job_id}: {get.extra['group']!r}, added to {group!r}")
        seq = place.get(get.job_id) if get.job_id == add.job_id else None
        lease_ms = get.extra.get("lease_ms")
        lease = (float(lease_ms) / 1000 if lease_ms is not None
                 else float(add.extra.get("retry", 0)))
        end = get.start + lease
        settle = next((o.start for o in settles.get((get.process, get.job_id), ())
                       if o.start >= get.end), None)
        if settle is not None:
            end = min(end, settle)
        late = _late_ack(get, taken[get.job_id], settles)
        if late is not None:
            end = min(end, late)
        by_group[group].append(Delivery(get, get.job_id, group, seq, get.end, end))
    result.deliveries = sum(len(d) for d in by_group.values())

    for group, deliveries in sorted(by_group.items()):
        deliveries.sort(key=lambda d: (d.get.end, int(d.get.extra.get("pos", 0))))
        result.delivered += 1
        if _first_deliveries_in_order(deliveries):
            result.in_order += 1
        for at, text in _out_of_order(deliveries, order[group], first_ack):
            _count(result, result.out_of_order, "out of order", group, text,
                   cause(history.faults, at, at, window[group]))
        for lo, hi, text in _overlapping(deliveries):
            _count(result, result.overlapping, "overlapping", group, text,
                   cause(history.faults, lo, hi, window[group]))
    return result


def _late_ack(get: Op, taken: list[tuple[float, str, float]],
              settles: dict[tuple[str, str], list[Op]]) -> float | None:
    """When an ACK, begun after ``get``'s GETJOB was sent, came from the
    consumer of an *earlier* delivery of the same job whose lease may have
    ended before ``get``'s reply (None: none did).

    That is at-least-once on one node: the earlier lease ended, the node
    queued the job again and handed it out with ``get``, then the earlier
    consumer's late ACK settled the job and released its group, whatever
    ``get``'s consumer still does with it."""
    assert get.job_id is not None
    before = {process for start, process, lease_end in taken
              if start < get.start and process != get.process and lease_end <= get.end}
    return min((o.start for process in before for o in settles.get((process, get.job_id), ())
                if o.kind == "ack" and o.start >= get.start), default=None)


def requeue_window(add: Op) -> float:
    """How long after a fault ends a group may still be served on two nodes,
    or queued again, because of it (module docstring)."""
    retry = float(add.extra.get("retry", 0))
    replicate = int(add.extra.get("replicate", 1))
    return retry + RANK_WAIT_S * max(0, replicate - 1) + WILLQUEUE_AND_JITTER_S


def cause(faults: Iterable[Fault], lo: float, hi: float, window: float) -> str:
    """The kinds of the faults in force between ``lo`` and ``hi``, or ended
    less than ``window`` before ``lo`` ("kill+partition"), or ``none``."""
    kinds = {f.kind for f in faults
             if f.start <= hi and (f.end is None or f.end + window >= lo)}
    return "+".join(sorted(kinds)) or "none"


def _count(result: GroupResult, counter: Counter[str], rule: str, group: str, text: str,
           why: str) -> None:
    counter[why] += 1
    line = f"{rule} [{why}] group {group}: {text}"
    if why == "none":
        result.unexplained.append(line)
    if counter.total() <= EXAMPLES:
        result.examples.append(line)


def _first_deliveries_in_order(deliveries: list[Delivery]) -> bool:
    seen: set[str] = set()
    last = -1
    for d in deliveries:
        if d.seq is None or d.job in seen:
            continue
        seen.add(d.job)
        if d.seq < last:
            return False
        last = d.seq
    return True


def _out_of_order(deliveries: list[Delivery], order: list[str],
                  first_ack: dict[str, float]) -> Iterable[tuple[float, str]]:
    """(when, what) for each delivery of a job before an older one's ACK began."""
    inf = float("inf")
    # latest[k]: the latest first ACK (inf: none) among the jobs before #k.
    latest = [*itertools.accumulate((first_ack.get(j, inf) for j in order), max,
                                    initial=-inf)]
    for d in deliveries:
        if d.seq is None or latest[d.seq] < d.get.end:
            continue
        before_in_reply = {o.job for o in deliveries if o.reply == d.reply
                           and int(o.get.extra.get("pos", 0)) < int(d.get.extra.get("pos", 0))}
        for k in range(d.seq - 1, -1, -1):
            older = order[k]
            acked = first_ack.get(older, inf)
            if acked >= d.get.end and older not in before_in_reply:
                when = "never acked" if acked == inf else f"first ACK at {acked:.2f}s"
                yield d.get.end, f"{d.text()} before {older} (#{k}, {when})"
                break


def _overlapping(deliveries: list[Delivery]) -> Iterable[tuple[float, float, str]]:
    """(from, to, what) for each pair of deliveries of two jobs held at once."""
    holds = sorted((d for d in deliveries if d.hold_end > d.hold_start),
                   key=lambda d: d.hold_start)
    active: list[Delivery] = []
    for d in holds:
        active = [a for a in active if a.hold_end > d.hold_start]
        for a in active:
            if a.job != d.job and a.reply != d.reply:
                hi = min(a.hold_end, d.hold_end)
                yield d.hold_start, hi, (f"{a.text()} held until {a.hold_end:.2f}s while "
                                         f"{d.text()} held until {d.hold_end:.2f}s")
        active.append(d)
