"""The checker on hand-written histories: each rule catches what it must."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from faults.checker import FinalState, check
from faults.history import FAIL, INFO, OK, Fault, History, Op


def op(kind: str, start: float, end: float, outcome: str = OK, job: str | None = None,
       body: str | None = None, process: str = "p1", node: str = "n1", **extra) -> Op:
    return Op(process, kind, node, start, end, outcome, job, body, None, dict(extra))


def history(*ops: Op, faults: tuple[Fault, ...] = ()) -> History:
    h = History()
    h.ops = list(ops)
    h.faults = list(faults)
    h.marks = {"workload": 0.0, "stopped": 20.0}
    return h


def add(job: str, body: str, start: float = 1.0, outcome: str = OK, replicate: int = 2,
        is_async: bool = False, **extra) -> Op:
    return op("add", start, start + 0.01, outcome, job if outcome == OK else None, body,
              replicate=replicate, retry=3, **{"async": is_async}, **extra)


def get(job: str, body: str, start: float, process: str = "c1", end: float | None = None,
        role: str = "normal", nacks: int = 0, additional_deliveries: int = 0) -> Op:
    return op("get", start, start + 0.01 if end is None else end, OK, job, body,
              process=process, role=role, nacks=nacks,
              additional_deliveries=additional_deliveries)


def test_a_synchronous_job_never_delivered_is_lost() -> None:
    result = check(history(add("J1", "b1"), add("J2", "b2"), get("J2", "b2", 2.0)),
                   FinalState())
    assert result.lost == ["J1"]
    assert any("never delivered" in d for d in result.defects())


def test_async_and_unknown_outcomes_are_not_lost() -> None:
    result = check(history(add("J1", "b1", is_async=True), add("J2", "b2", outcome=INFO),
                           add("J3", "b3", outcome=FAIL)), FinalState())
    assert result.lost == []
    assert result.async_undelivered == ["J1"]
    assert result.defects() == []


def wiped(node: str, at: float) -> Fault:
    return Fault("kill", f"SIGKILL {node}", [node], at, at + 1, lost_for_good=True)


def test_a_loss_is_excused_only_when_every_known_copy_was_wiped() -> None:
    one = check(history(add("J1", "b1", copies=["n1", "n2"]), faults=(wiped("n1", 2.0),)),
                FinalState())
    assert one.lost == ["J1"]
    others = check(history(add("J1", "b1", copies=["n1", "n2"]),
                           faults=(wiped("n1", 2.0), wiped("n3", 3.0))), FinalState())
    assert others.lost == ["J1"], "wiping a node without a copy excuses nothing"
    both = check(history(add("J1", "b1", copies=["n1", "n2"]),
                         faults=(wiped("n1", 2.0), wiped("n2", 5.0))), FinalState())
    assert both.lost == [] and both.lost_excused == ["J1"]
    assert both.excused_by == {"every copy wiped": 1}
    before = check(history(add("J1", "b1", start=9.0, copies=["n1", "n2"]),
                           faults=(wiped("n1", 2.0), wiped("n2", 5.0))), FinalState())
    assert before.lost == ["J1"], "kills before the ADDJOB cannot excuse it"


def test_without_known_copies_a_loss_is_excused_by_counting_wiped_nodes() -> None:
    two = check(history(add("J1", "b1", replicate=2),
                        faults=(wiped("n1", 2.0), wiped("n3", 5.0))), FinalState())
    assert two.lost == [] and two.lost_excused == ["J1"]
    assert check(history(add("J1", "b1", replicate=2), faults=(wiped("n1", 2.0),)),
                 FinalState()).lost == ["J1"]


def test_a_delivery_after_the_gc_completed_is_a_defect() -> None:
    ops = (add("J1", "b1"), get("J1", "b1", 2.0), op("ack", 2.1, 2.2, OK, "J1"),
           op("gc", 2.3, 2.5, OK, "J1", process="gc"), get("J1", "b1", 3.0, "c2"))
    result = check(history(*ops), FinalState())
    assert result.delivered_after_gc == ["J1"]
    assert any("after a completed ACK" in d for d in result.defects())


def test_a_delivery_after_an_ack_but_before_the_gc_is_allowed() -> None:
    ops = (add("J1", "b1"), get("J1", "b1", 2.0), op("ack", 2.1, 2.2, OK, "J1"),
           get("J1", "b1", 3.0, "c2"), op("gc", 2.9, 4.0, OK, "J1", process="gc"))
    result = check(history(*ops), FinalState())
    assert result.delivered_after_gc == []
    assert result.delivered_after_ack == 1
    assert result.duplicates == {"after ack": 1}


def test_duplicates_are_classified() -> None:
    ops = (
        add("N", "bn"), get("N", "bn", 2.0), op("nack", 2.1, 2.2, OK, "N"), get("N", "bn", 2.3),
        add("C", "bc"), get("C", "bc", 2.0), op("crash", 2.1, 2.1, OK, "C"),
        get("C", "bc", 5.2),
        add("S", "bs"), get("S", "bs", 2.0, role="slow"),
        get("S", "bs", 5.5, additional_deliveries=1),
        add("P", "bp"), get("P", "bp", 6.0), get("P", "bp", 7.0, "c2"),
        add("Q", "bq"), get("Q", "bq", 10.0), get("Q", "bq", 10.5, "c2"),
        add("R", "br"), get("R", "br", 11.0), get("R", "br", 14.5, "c2",
                                                    additional_deliveries=1),
    )
    part = Fault("partition", "majority: n1 | n2,n3", ["n1", "n2", "n3"], 5.0, 9.0)
    result = check(history(*ops, faults=(part,)), FinalState())
    assert result.duplicates == {"nack": 1, "consumer crashed": 1, "slow consumer": 1,
                                 "partition": 1, "other: queued twice": 1,
                                 "other: requeued": 1}
    assert result.defects() == []


def test_the_counters_tell_a_nack_the_history_shows_late() -> None:
    """A GETJOB blocked since before the NACK returns the job NACKed: its
    nacks counter says why, although the NACK op started after it."""
    ops = (add("N", "bn"), get("N", "bn", 2.0), get("N", "bn", 1.9, "c2", end=2.3, nacks=1),
           op("nack", 2.2, 2.25, OK, "N"))
    result = check(history(*ops), FinalState())
    assert result.duplicates == {"nack": 1}
    assert result.early_requeue == []
def test_phantom_deliveries_and_the_final_state_are_defects() -> None:
    final = FinalState(registered_jobs={"n1": 1, "n2": 0}, jobs={"n1": [("J9", "acked")]},
                       queued_twice={"J8": ["n1", "n2"]})
    result = check(history(get("J7", "nobody-added-this", 2.0)), final)
    text = "\n".join(result.defects())
    assert result.phantom == ["J7"]
    assert "queued on several nodes" in text and "left on nodes" in text
    assert "registered_jobs" in text


def test_unavailability_is_the_longest_gap_between_successful_adds() -> None:
    ops = [add(f"J{i}", f"b{i}", start=t) for i, t in enumerate((0.5, 1.0, 6.0, 6.5))]
    ops.append(add("X", "bx", start=19.0, outcome=FAIL))
    result = check(history(*ops, *(get(f"J{i}", f"b{i}", 7.0) for i in range(4))),
                   FinalState())
    assert 12.4 < result.max_unavailable_s < 12.6  # 6.51 .. 19.0 (the last attempt)


def test_time_bounds_of_delay_ttl_and_retry() -> None:
    timed = {"delay": 3, "ttl": 16}
    ops = (
        add("E", "be", **timed), get("E", "be", 2.0),                   # before DELAY 3
        add("L", "bl", **timed), get("L", "bl", 4.5), get("L", "bl", 18.5, "c2"),  # after TTL
        add("R", "br"), get("R", "br", 1.2), get("R", "br", 2.0, "c2",  # RETRY 3: early
                                                 additional_deliveries=1),
        add("K", "bk", **timed), get("K", "bk", 4.2), get("K", "bk", 7.5, "c2",
                                                          additional_deliveries=1),
    )
    result = check(history(*ops), FinalState())
    assert result.early_delivery == ["E"]
    assert result.late_delivery == ["L"]
    assert result.early_requeue == ["R"]
    text = "\n".join(result.defects())
    assert "before their DELAY" in text and "after their TTL" in text
    assert "sooner than RETRY" in text


def test_ttl_jobs_may_expire_undelivered_and_ids_must_be_unique() -> None:
    result = check(history(add("T", "bt", delay=3, ttl=16), add("D", "b1"), add("D", "b2"),
                           get("D", "b1", 2.0)), FinalState())
    assert result.lost == [] and result.expired_undelivered == ["T"]
    assert result.duplicate_ids == ["D"]
    assert any("IDs answered to two ADDJOBs" in d for d in result.defects())


def test_overlapping_faults_are_listed() -> None:
    faults = (Fault("partition", "p", ["n1"], 1.0, 5.0), Fault("pause", "q", ["n2"], 4.0, 6.0),
              Fault("kill", "k", ["n3"], 7.0, 8.0))
    result = check(history(faults=faults), FinalState())
    assert result.overlaps == [("1.0s partition: p", "4.0s pause: q")]


def test_rss_growth_is_fitted_once_the_windows_are_full_and_across_no_restart() -> None:
    from faults.report import rss_growth_per_hour

    def samples(rss_at: Callable[[float], float], until: float = 3600) -> list[dict[str, Any]]:
        return [{"t": t, "phase": "healed", "n1": {"rss": rss_at(t)}}
                for t in range(0, int(until) + 1, 60)]

    # Windows filling for 10 minutes (steep), then 1 MB an hour.
    growing = samples(lambda t: 33e6 + min(t, 600) * 5e3 + t * 1e6 / 3600)
    assert rss_growth_per_hour(growing, "n1") == pytest.approx(1.0)
    # Flat, but restarted at minute 20 (RSS drops, then fills again): the
    # fit keeps to the longest stretch and leaves out its filling minutes.
    restarted = samples(lambda t: 36e6 if t < 1200 else 33e6 + min(t - 1200, 600) * 5e3)
    assert rss_growth_per_hour(restarted, "n1") == pytest.approx(0.0, abs=1e-9)
    assert rss_growth_per_hour(samples(lambda t: 36e6, until=1500), "n1") is None  # too short


# -- ordered groups (faults.groups) --------------------------------------------


def gadd(job: str, seq: int, group: str = "g1", start: float | None = None,
         outcome: str = OK, **extra: Any) -> Op:
    """The ``seq``-th ADDJOB of ``group`` (one producer per group, in turn)."""
    return add(job, f"b-{job}", start=seq * 0.1 if start is None else start,
               outcome=outcome, group=group, seq=seq, client=True, **extra)


def gget(job: str, start: float, process: str = "c1", lease_ms: int | None = 3000,
         end: float | None = None, pos: int = 0, group: str | None = "g1",
         node: str = "n1", body: str | None = None) -> Op:
    return op("get", start, start + 0.01 if end is None else end, OK, job,
              body or f"b-{job}", process=process, node=node, role="normal", nacks=0,
              additional_deliveries=0, pos=pos, lease_ms=lease_ms, group=group)


def ack(job: str, start: float, process: str = "c1", outcome: str = OK) -> Op:
    return op("ack", start, start + 0.01, outcome, job, process=process)


def test_a_group_delivered_in_order_one_job_at_a_time_counts_nothing() -> None:
    ops = (gadd("A", 1), gadd("B", 2), gadd("C", 3),
           gget("A", 2.0), ack("A", 2.5),
           gget("B", 2.6, "c2"), ack("B", 2.7, "c2"),
           gget("C", 2.8), ack("C", 3.5))
    g = check(history(*ops), FinalState()).groups
    assert (g.keys, g.jobs, g.deliveries, g.delivered, g.in_order) == (1, 3, 3, 1, 1)
    assert g.out_of_order == {} and g.overlapping == {} and g.unexplained == []


def test_a_delivery_before_an_older_jobs_ack_began_is_out_of_order() -> None:
    # B goes out at 2.41 while A (older) is still out: its ACK starts at 2.5.
    ops = (gadd("A", 1), gadd("B", 2), gget("A", 2.0), gget("B", 2.4, "c2"),
           ack("A", 2.5), ack("B", 2.6, "c2"))
    result = check(history(*ops), FinalState())
    g = result.groups
    assert g.out_of_order == {"none": 1} and g.in_order == 1
    assert "B (#1) from n1 to c2 at 2.41s before A (#0, first ACK at 2.50s)" in g.unexplained[0]
    assert any("out-of-order deliveries of a group with no fault" in d
               for d in result.defects())


def test_an_ack_begun_before_the_reply_excuses_and_a_nack_does_not() -> None:
    # A's ACK started (2.40) before B's GETJOB returned (2.41): it may have
    # been settled in time, whenever the ACK's reply came.
    begun = check(history(gadd("A", 1), gadd("B", 2), gget("A", 2.0), ack("A", 2.40),
                          gget("B", 2.3, "c2", end=2.41)), FinalState()).groups
    assert begun.out_of_order == {}
    # A NACK puts A back first in its group: B must still wait for A's ACK.
    nacked = check(history(gadd("A", 1), gadd("B", 2), gget("A", 2.0),
                           op("nack", 2.1, 2.11, OK, "A", process="c1"),
                           gget("B", 2.3, "c2"), gget("A", 2.5), ack("A", 2.6)),
                   FinalState()).groups
    assert nacked.out_of_order == {"none": 1}
    # An older job never acked at all: every later delivery is out of order.
    never = check(history(gadd("A", 1), gadd("B", 2), gadd("C", 3), gget("B", 2.0),
                          ack("B", 2.1), gget("C", 2.2), ack("C", 2.3)), FinalState()).groups
    assert never.out_of_order == {"none": 2}
    assert "before A (#0, never acked)" in never.unexplained[0]


def test_the_jobs_of_one_reply_count_in_their_order_in_it() -> None:
    # The drain's GETJOB COUNT 100: A then B of one group in one reply is
    # the group's batch, held once; B before A in it is out of order.
    in_order = (gadd("A", 1), gadd("B", 2), gget("A", 2.0, "drain", pos=0),
                gget("B", 2.0, "drain", pos=1), ack("A", 2.1, "drain"), ack("B", 2.1, "drain"))
    g = check(history(*in_order), FinalState()).groups
    assert g.out_of_order == {} and g.overlapping == {}
    reversed_ = (gadd("A", 1), gadd("B", 2), gget("B", 2.0, "drain", pos=0),
                 gget("A", 2.0, "drain", pos=1), ack("A", 2.1, "drain"),
                 ack("B", 2.1, "drain"))
    g = check(history(*reversed_), FinalState()).groups
    assert g.out_of_order == {"none": 1} and g.overlapping == {} and g.in_order == 0


def test_two_jobs_of_a_group_held_at_once_overlap_until_an_ack_or_the_lease_ends() -> None:
    # A held 2.01 .. 2.5 (its ACK starts); B, out of order too, held from 2.21.
    held = check(history(gadd("A", 1), gadd("B", 2), gget("A", 2.0), gget("B", 2.2, "c2"),
                         ack("A", 2.5), ack("B", 2.6, "c2")), FinalState()).groups
    assert held.overlapping == {"none": 1}
    assert "A (#0) from n1 to c1 at 2.01s held until 2.50s while B (#1)" in \
        held.unexplained[-1]
    # A's lease (150 ms from its GETJOB's start) ends at 2.15: the node queued
    # it again, so c1 working on past that holds nothing (at least once).
    # B going out at 2.21 is still before A's first ACK: out of order.
    lease = check(history(gadd("A", 1), gadd("B", 2), gget("A", 2.0, lease_ms=150),
                          gget("B", 2.2, "c2"), ack("A", 2.5), ack("B", 2.6, "c2")),
                  FinalState()).groups
    assert lease.overlapping == {} and lease.out_of_order == {"none": 1}
    # A consumer that crashed holds the job until its lease ends: A's lease
    # runs to 3.0, B (after A's ACK by another consumer) goes out at 2.7.
    crashed = check(history(gadd("A", 1), gadd("B", 2), gget("A", 2.0, lease_ms=1000),
                            op("crash", 2.05, 2.05, OK, "A", process="c1"),
                            gget("A", 2.3, "c3"), ack("A", 2.4, "c3"),
                            gget("B", 2.6, "c2", end=2.7), ack("B", 2.8, "c2")),
                    FinalState()).groups
    assert crashed.overlapping == {"none": 1} and crashed.out_of_order == {}
    # One job delivered twice at once is at-least-once, not two consumers
    # of the group; without a lease known, RETRY (3 s) bounds the hold.
    same = check(history(gadd("A", 1), gget("A", 2.0, lease_ms=None),
                         gget("A", 2.2, "c2", lease_ms=None), ack("A", 2.5),
                         ack("A", 2.6, "c2")), FinalState()).groups
    assert same.overlapping == {} and same.out_of_order == {}


def test_a_late_ack_of_an_earlier_delivery_ends_the_hold_of_the_next() -> None:
    # c2 is slow: A's lease (from 2.0, 1 s) ends, the node hands A to c3
    # (which crashes with it), then c2's late ACK settles A and releases
    # the group: B going out at 3.51 is at-least-once on one node, though
    # c3's lease on A runs to 6.0.
    late = (gadd("A", 1), gadd("B", 2), gget("A", 2.0, "c2", lease_ms=1000),
            gget("A", 3.0, "c3"), op("crash", 3.02, 3.02, OK, "A", process="c3"),
            ack("A", 3.4, "c2"), gget("B", 3.5, "c1"), ack("B", 3.6, "c1"))
    g = check(history(*late), FinalState()).groups
    assert g.overlapping == {} and g.out_of_order == {}
    # The same ACK while c2's lease still ran (to 5.0): A reached c3 from a
    # second node serving the group, and c3 still holds it when B goes out.
    early = (gadd("A", 1), gadd("B", 2), gget("A", 2.0, "c2", lease_ms=3000),
             gget("A", 3.0, "c3", node="n2"), op("crash", 3.02, 3.02, OK, "A", process="c3"),
             ack("A", 3.4, "c2"), gget("B", 3.5, "c1"), ack("B", 3.6, "c1"))
    g = check(history(*early), FinalState()).groups
    assert g.overlapping == {"none": 1} and g.out_of_order == {}


def test_group_violations_are_put_down_to_the_faults_in_force_or_just_ended() -> None:
    # RETRY 3, REPLICATE 2: a group is queued again within 3 + 2 + 1 = 6 s
    # of a fault's end.
    def violation(at: float) -> tuple[Op, ...]:
        return (gget("B", at, "c2"), ack("A", at + 0.5), ack("B", at + 0.6, "c2"))

    base = (gadd("A", 1, replicate=2), gadd("B", 2, replicate=2), gget("A", 1.0))
    kill = Fault("kill", "SIGKILL n1", ["n1"], 1.5, 3.0)
    pause = Fault("pause", "SIGSTOP n2", ["n2"], 2.0, 2.9)
    assert check(history(*base, *violation(2.5), faults=(kill,)),
                 FinalState()).groups.out_of_order == {"kill": 1}
    both = check(history(*base, *violation(2.5), faults=(kill, pause)), FinalState())
    assert both.groups.out_of_order == {"kill+pause": 1}
    assert both.groups.overlapping == {"kill+pause": 1}
    assert both.defects() == []
    # Ended 5.5 s before: within the window; 6.5 s before: not.
    assert check(history(*base, *violation(8.5), faults=(kill,)),
                 FinalState()).groups.out_of_order == {"kill": 1}
    late = check(history(*base, *violation(9.5), faults=(kill,)), FinalState())
    assert late.groups.out_of_order == {"none": 1} and late.defects()
    # A fault that began after the violation explains nothing.
    after = Fault("partition", "majority: n1 | n2,n3", ["n1", "n2", "n3"], 3.0, 4.0)
    assert check(history(*base, *violation(2.0), faults=(after,)),
                 FinalState()).groups.out_of_order == {"none": 1}


def test_a_resent_groups_job_is_no_phantom_and_has_no_place_in_the_order() -> None:
    # The client lost the reply of n1 and sent the ADDJOB to n2 (ID A2):
    # n1 had added it too (A1).  A1's delivery is no phantom; it counts for
    # overlaps but not for the order.
    ops = (gadd("A2", 1, resent=["n1"]), gadd("B", 2),
           gget("A2", 2.0), ack("A2", 2.1),
           gget("B", 2.2), ack("B", 2.5),
           gget("A1", 2.3, "c2", body="b-A2", node="n1"), ack("A1", 2.4, "c2"))
    result = check(history(*ops), FinalState())
    assert result.phantom == [] and result.groups.resent == 1
    assert result.groups.out_of_order == {} and result.groups.overlapping == {"none": 1}
    unresent = check(history(gadd("A2", 1), gget("A1", 2.3, "c2", body="b-A2"),
                             ack("A1", 2.4, "c2")), FinalState())
    assert unresent.phantom == ["A1"]


def test_a_delivery_with_another_group_key_is_a_defect() -> None:
    result = check(history(gadd("A", 1), gget("A", 2.0, group=None), ack("A", 2.1)),
                   FinalState())
    assert result.groups.wrong_key == ["A: None, added to 'g1'"]
    assert any("another group key" in d for d in result.defects())
