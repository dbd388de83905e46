"""LeaseKeeper rules, with WORKING answers injected (the node is tested elsewhere)."""

from __future__ import annotations

import pytest

from disque.exceptions import ConnectionFailed, NoJob
from spark_connector.leases import MIN_INTERVAL_S, LeaseKeeper


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_interval_is_a_third_of_the_smallest_retry() -> None:
    clock = Clock()
    sent: list[list[str]] = []

    def working(ids: list[str]) -> list:
        sent.append(ids)
        return [30, 9, 0][: len(ids)]

    keeper = LeaseKeeper(working, clock=clock)
    keeper.hold(1, ["a", "b", "c"], start=False)
    assert keeper.renew_due() == 3
    assert keeper.renew_due() == 0           # next one is due in 9 / 3 = 3 s
    clock.now += 3.01
    assert keeper.renew_due() == 3
    assert keeper.heartbeats_sent == 6 and keeper.leases_lost == 0


def test_tiny_retry_is_clamped_and_retry_zero_needs_no_heartbeat() -> None:
    clock = Clock()
    keeper = LeaseKeeper(lambda ids: [1] * len(ids), clock=clock)
    keeper.hold(1, ["a"], start=False)
    keeper.renew_due()
    clock.now += MIN_INTERVAL_S - 0.01
    assert keeper.renew_due() == 0
    zero = LeaseKeeper(lambda ids: [0] * len(ids), clock=clock)
    zero.hold(1, ["a"], start=False)
    zero.renew_due()
    clock.now += 10_000
    assert zero.renew_due() == 0


def test_refused_heartbeats_count_as_lost_and_are_not_retried() -> None:
    keeper = LeaseKeeper(lambda ids: [NoJob("NOJOB gone") if i == "b" else 3 for i in ids],
                         clock=Clock())
    keeper.hold(1, ["a", "b"], start=False)
    keeper.renew_due()
    assert keeper.leases_lost == 1


def test_an_ack_racing_a_heartbeat_is_not_a_lost_lease() -> None:
    keeper: LeaseKeeper

    def working(ids: list[str]) -> list:
        keeper.release_through(1)  # the batch is acknowledged while WORKING is in flight
        return [NoJob("NOJOB acked") for _ in ids]

    keeper = LeaseKeeper(working, clock=Clock())
    keeper.hold(1, ["a", "b"], start=False)
    keeper.renew_due()
    assert keeper.leases_lost == 0 and keeper.held() == {}


def test_hold_merges_ids_of_the_same_batch() -> None:
    keeper = LeaseKeeper(lambda ids: [5] * len(ids), clock=Clock())
    keeper.hold(1, [f"id{i}" for i in range(100_000)], start=False)
    keeper.hold(1, [f"id{i}" for i in range(50_000, 150_000)], start=False)
    assert keeper.held() == {1: 150_000}


def test_a_job_whose_node_could_not_be_asked_is_not_lost_and_is_asked_again() -> None:
    clock = Clock()
    down = {"b"}

    def working(ids: list[str]) -> list:
        return [ConnectionFailed("its node could not be asked", {}) if i in down else 9
                for i in ids]

    keeper = LeaseKeeper(working, clock=clock)
    keeper.hold(1, ["a", "b"], start=False)
    assert keeper.renew_due() == 2
    assert keeper.leases_lost == 0
    down.clear()
    clock.now += 3.01
    assert keeper.renew_due() == 2  # "b" again, with the batch's next heartbeat


def test_a_round_no_node_answered_is_due_again_at_the_next_tick() -> None:
    clock = Clock()
    answering = False

    def working(ids: list[str]) -> list:
        if not answering:
            raise ConnectionFailed("no Disque node reachable", {})
        return [9] * len(ids)

    keeper = LeaseKeeper(working, clock=clock, tick_s=0.25)
    keeper.hold(1, ["a"], start=False)
    keeper.hold(2, ["b"], start=False)
    with pytest.raises(ConnectionFailed):
        keeper.renew_due()
    answering = True
    clock.now += 0.25
    assert keeper.renew_due() == 2  # both batches, not left without heartbeats


def test_a_lease_counted_lost_at_a_restart_is_not_counted_again() -> None:
    keeper = LeaseKeeper(lambda ids: [NoJob("NOJOB acked elsewhere") for _ in ids],
                         clock=Clock())
    keeper.hold(1, ["a", "b"], start=False)
    assert keeper.count_lost(1) == 2  # the restart found their lease ran out
    keeper.renew_due()  # another consumer took and acknowledged them meanwhile
    assert keeper.leases_lost == 2
