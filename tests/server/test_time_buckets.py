"""``disque.time_buckets.TimeBuckets`` against a plain model, under random use.

The schedule and the blocked commands' deadlines rely on it: every item
added is found in its bucket until it is removed, the earliest bucket
comes first, and a bucket that was emptied and deleted (by ``remove``,
``drop`` or ``clear``) is never filled again behind the table's back (add()
and remove() remember recent buckets by number modulo ``RECENT``).
"""

from __future__ import annotations

import random

import pytest

from disque.time_buckets import RECENT, TimeBuckets


def _contents(times: TimeBuckets[int]) -> dict[int, set[int]]:
    """Every bucket the table holds, emptying it through earliest()/drop() on a copy's behalf."""
    found: dict[int, set[int]] = {}
    while (earliest := times.earliest()) is not None:
        number, bucket = earliest
        found[number] = set(bucket)
        bucket.clear()
        times.drop(number)
    return found


@pytest.mark.parametrize("seed", range(30))
def test_random_operations_match_a_model(seed: int) -> None:
    rng = random.Random(seed)
    times: TimeBuckets[int] = TimeBuckets()
    model: dict[int, set[int]] = {}
    where: dict[int, int] = {}
    next_item = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.5 or not where:
            # Mostly the same few buckets in a row, as a pipeline of commands
            # does; some beyond RECENT, which share the remembered slots.
            number = rng.choice([rng.randrange(5), rng.randrange(5), rng.randrange(50),
                                 rng.randrange(4 * RECENT)])
            times.add(number, next_item)
            model.setdefault(number, set()).add(next_item)
            where[next_item] = number
            next_item += 1
        elif op < 0.8:
            item = rng.choice(list(where))
            number = where.pop(item)
            times.remove(number, item)
            model[number].discard(item)
            if not model[number]:
                del model[number]
        elif op < 0.95:
            # What the schedule does: take items out of the earliest bucket
            # itself, then drop the bucket once it is empty.
            earliest = times.earliest()
            assert earliest is not None
            number, bucket = earliest
            assert number == min(model)
            assert set(bucket) == model[number]
            for item in list(bucket)[: rng.randrange(1, 4)]:
                del bucket[item]
                del where[item]
                model[number].discard(item)
            if not bucket:
                times.drop(number)
                del model[number]
        elif op < 0.96:
            times.clear()
            model.clear()
            where.clear()
        else:
            times.remove(rng.randrange(4 * RECENT), -1)  # not there: nothing happens
        assert len(times) == sum(map(len, model.values()))
    assert _contents(times) == model


def test_a_removed_bucket_is_not_filled_again() -> None:
    times: TimeBuckets[str] = TimeBuckets()
    times.add(7, "a")
    times.remove(7, "a")
    times.add(7, "b")  # the same number as the last add: a new bucket, in the table
    assert times.earliest() == (7, {"b": None})
    times.add(7, "c")
    times.drop(7)
    times.add(7, "d")
    assert times.earliest() == (7, {"d": None})
    times.clear()
    times.add(7, "e")
    assert len(times) == 1 and times.earliest() == (7, {"e": None})


def test_buckets_sharing_a_remembered_slot_stay_apart() -> None:
    times: TimeBuckets[str] = TimeBuckets()
    times.add(7, "a")
    times.add(7 + RECENT, "b")  # the same slot: it now remembers bucket 7 + RECENT
    times.add(7, "c")
    times.remove(7 + RECENT, "b")  # deleted while another number held the slot
    times.add(7 + RECENT, "d")
    assert _contents(times) == {7: {"a", "c"}, 7 + RECENT: {"d"}}
