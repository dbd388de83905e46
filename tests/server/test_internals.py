"""Unit tests of the node's hot-path data structures.

The awake schedule in buckets, job ID generation and validation, and the
garbage-collector policy are exercised directly; the state machine tests
(``test_state_machine.py``) cover them again through the commands.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import random
import re
import time
import tracemalloc
import weakref
from collections.abc import Callable

import pytest

from disque import _native, cyclic_gc
from disque.connection import ClientConnection, ReplyBatch
from disque.cyclic_gc import CollectorPolicy
from disque.job import _ID_PATTERN, Job, JobIdGenerator, are_valid_job_ids, is_valid_job_id
from disque.job_table import AwakeSchedule, JobRegistry

from .statekit import Node

NODE = "f" * 40


def make_job(registry: JobRegistry, ids: JobIdGenerator, awakeme: int) -> Job:
    job = Job(ids.next_id(3600, 60), b"q", b"x")
    registry.add(job)
    registry.schedule.move(job, awakeme)
    return job


# --------------------------------------------------------------------------
# AwakeSchedule
# --------------------------------------------------------------------------

def test_schedule_is_exact_inside_a_bucket() -> None:
    registry, ids = JobRegistry(), JobIdGenerator(NODE)
    base = 1_000_000 << AwakeSchedule.BUCKET_SHIFT  # the first ms of a bucket
    late = make_job(registry, ids, base + 9)
    early = make_job(registry, ids, base + 3)
    schedule = registry.schedule
    assert schedule.next_time() == base + 3
    assert schedule.pop_due(base + 2, 100) == []
    assert schedule.pop_due(base + 3, 100) == [early]
    assert early.awakeme == 0  # unscheduled
    assert schedule.next_time() == base + 9
    assert schedule.pop_due(base + 8, 100) == []
    assert schedule.pop_due(base + 100, 100) == [late]
    assert schedule.next_time() is None
    assert len(schedule) == 0


def test_schedule_orders_buckets_and_respects_the_limit() -> None:
    registry, ids = JobRegistry(), JobIdGenerator(NODE)
    times = [5000, 1000, 3000, 1001, 20000, 1002]
    jobs = {when: make_job(registry, ids, when) for when in times}
    schedule = registry.schedule
    first = schedule.pop_due(10_000, 2)
    assert [job.awakeme for job in first] == [0, 0]
    assert set(first) == {jobs[1000], jobs[1001]}
    rest = schedule.pop_due(10_000, 100)
    assert set(rest) == {jobs[1002], jobs[3000], jobs[5000]}
    assert schedule.next_time() == 20000
    assert len(schedule) == 1


def test_moved_and_forgotten_jobs_leave_nothing_behind() -> None:
    registry, ids = JobRegistry(), JobIdGenerator(NODE)
    moved = make_job(registry, ids, 1000)
    registry.schedule.move(moved, 90_000)
    gone = make_job(registry, ids, 1000)
    registry.remove(gone)
    same_bucket = make_job(registry, ids, 1001)
    registry.schedule.move(same_bucket, 1002)
    schedule = registry.schedule
    assert len(schedule) == 2 and gone.awakeme == 0
    assert schedule.next_time() == 1002
    assert schedule.pop_due(50_000, 100) == [same_bucket]
    assert schedule.pop_due(50_000, 100) == []
    assert schedule.pop_due(90_000, 100) == [moved]
    assert len(schedule) == 0


def test_forgotten_jobs_are_not_kept_alive_by_the_schedule() -> None:
    """Acked and deleted jobs are freed at once, not at their old awake time."""
    node = Node()
    ids = [node("ADDJOB", "q", b"%0100d" % i, 0, "RETRY", 300).encode() for i in range(200)]
    job = node.job(ids[0])
    node("GETJOB", "COUNT", 200, "FROM", "q")
    assert node("ACKJOB", *ids) == 200
    assert len(node.state.jobs) == 0 and len(node.state.jobs.schedule) == 0
    holders = [r for r in gc.get_referrers(job) if not inspect.isframe(r)]
    assert holders == []  # only this test's variable keeps the job


def test_requeue_happens_at_its_millisecond_through_the_commands() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 2).encode()
    node("GETJOB", "FROM", "q")
    requeue_at = node.job(job_id).qtime
    node.advance(requeue_at - node.clock.now_ms() - 1)
    assert node("QLEN", "q") == 0
    node.advance(1)
    assert node("QLEN", "q") == 1


# --------------------------------------------------------------------------
# Job IDs
# --------------------------------------------------------------------------

def test_ids_stay_unique_and_valid_across_random_blocks() -> None:
    ids = JobIdGenerator(NODE)
    made = [ids.next_id(86400, 300) for _ in range(3 * JobIdGenerator.ID_BLOCK + 7)]
    assert len(set(made)) == len(made)
    assert all(is_valid_job_id(job_id) for job_id in made)
    assert {job_id[:11] for job_id in made} == {b"D-ffffffff-"}


@pytest.mark.parametrize(("ttl", "retry", "suffix"), [
    (86400, 300, b"-05a1"), (86400, 0, b"-05a0"), (59, 1, b"-0001"), (10 ** 9, 5, b"-ffff")])
def test_id_ttl_suffix(ttl: int, retry: int, suffix: bytes) -> None:
    assert JobIdGenerator(NODE).next_id(ttl, retry).endswith(suffix)


GOOD = b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


@pytest.mark.parametrize("ids", [
    [GOOD], [GOOD] * 3, [GOOD, GOOD.replace(b"8YL", b"abc")],
])
def test_valid_id_lists(ids: list[bytes]) -> None:
    assert are_valid_job_ids(ids)


@pytest.mark.parametrize("ids", [
    [b""], [GOOD, b""], [GOOD + b" " + GOOD], [GOOD, GOOD + b" " + GOOD], [GOOD[:-1]],
    [GOOD + b"0"], [GOOD.replace(b"D-", b"d-")], [GOOD.replace(b"dcb8", b"DCB8")],
    [GOOD.replace(b"-05a1", b"-05A1")], [GOOD.replace(b"+", b"_")], [GOOD, GOOD + b"\n"],
    [b" ".join([GOOD] * 2), GOOD[:0]],
])
def test_invalid_id_lists(ids: list[bytes]) -> None:
    assert not are_valid_job_ids(ids)
    assert not all(is_valid_job_id(job_id) for job_id in ids)


def test_the_id_check_agrees_with_the_id_pattern() -> None:
    """is_valid_job_id (a translate and one integer mask, not a regular
    expression) against the pattern, on IDs with 1-3 random bytes changed."""
    pattern = re.compile(_ID_PATTERN)
    rng = random.Random(16)
    for _ in range(50_000):
        job_id = bytearray(GOOD)
        for _ in range(rng.randint(1, 3)):
            job_id[rng.randrange(40)] = rng.randrange(256)
        assert is_valid_job_id(bytes(job_id)) == (pattern.fullmatch(job_id) is not None)
    for length in (0, 1, 39, 41, 80):
        assert not is_valid_job_id((GOOD * 2)[:length])


def test_the_id_list_check_agrees_with_the_id_pattern() -> None:
    """are_valid_job_ids (passes over the joined IDs) against the pattern on
    every ID, on lists where 1-3 bytes changed, or an ID lost or gained a
    byte (a space too: the joined IDs must not line up again)."""
    pattern = re.compile(_ID_PATTERN)
    rng = random.Random(41)
    ids = [JobIdGenerator(NODE).next_id(60, 1) for _ in range(7)]
    assert are_valid_job_ids(ids)
    for _ in range(20_000):
        changed = [bytearray(job_id) for job_id in ids[:rng.randint(2, 7)]]
        for _ in range(rng.randint(1, 3)):
            job_id = rng.choice(changed)
            where = rng.randrange(len(job_id))
            action = rng.random()
            if action < 0.6:
                job_id[where] = rng.choice((rng.randrange(256), 0x20, 0x44, 0x2D))
            elif action < 0.8:
                del job_id[where]
            else:
                job_id.insert(where, rng.choice((0x20, 0x61, 0x44)))
        expected = all(pattern.fullmatch(job_id) for job_id in changed)
        assert are_valid_job_ids([bytes(job_id) for job_id in changed]) == expected


# --------------------------------------------------------------------------
# The collector policy
# --------------------------------------------------------------------------

def test_collector_policy_freezes_then_hands_back() -> None:
    policy = CollectorPolicy(now=0.0)
    try:
        gc.unfreeze()
        policy.tick(cyclic_gc.FREEZE_PERIOD_S / 2)
        assert gc.get_freeze_count() == 0
        policy.tick(cyclic_gc.FREEZE_PERIOD_S)
        assert gc.get_freeze_count() > 0 and policy.freezes == 1
        policy.tick(cyclic_gc.UNFREEZE_PERIOD_S)
        assert gc.get_freeze_count() == 0 and policy.unfreezes == 1
        # The next freeze comes a full period after the hand-back.
        policy.tick(cyclic_gc.UNFREEZE_PERIOD_S + cyclic_gc.FREEZE_PERIOD_S / 2)
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_collector_policy_install_keeps_full_collections_off_between_freezes() -> None:
    before = gc.get_threshold()
    try:
        CollectorPolicy.install()
        gen0, gen1, gen2 = gc.get_threshold()
        assert (gen0, gen1) == before[:2]
        assert gen2 == cyclic_gc.FULL_COLLECTION_THRESHOLD > before[2]
        # Young garbage cycles are still collected by the cheap generations.
        obj = Cycle()
        alive = weakref.ref(obj)
        del obj
        gc.collect(1)
        assert alive() is None
    finally:
        gc.set_threshold(*before)


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_collector_policy_frees_cycles_that_died_while_frozen() -> None:
    policy = CollectorPolicy(now=0.0)
    try:
        gc.unfreeze()
        obj = Cycle()
        alive = weakref.ref(obj)
        policy.tick(cyclic_gc.FREEZE_PERIOD_S)      # obj is frozen...
        del obj                                     # ...and dies there
        gc.collect()
        assert alive() is not None                  # frozen: out of the collector's sight
        policy.tick(cyclic_gc.UNFREEZE_PERIOD_S)     # the hourly hand-back collects it
        assert alive() is None
    finally:
        gc.unfreeze()


# --------------------------------------------------------------------------
# ReplyBatch
# --------------------------------------------------------------------------

class RecordingTransport:
    """The transport methods a connection uses, recording what is written."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 7711)

    def get_write_buffer_size(self) -> int:
        return 0


def connect(node: Node) -> tuple[ClientConnection, RecordingTransport]:
    """A client connection to ``node`` over a transport that records what it writes."""
    transport = RecordingTransport()
    conn = ClientConnection(node.state, ReplyBatch(node.state))
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0)


class FailingOnceAOF:
    """What ReplyBatch asks of the AOF (its before_reply), recording when it
    ran and failing the first time: the replies must go out anyway."""

    def __init__(self, written: Callable[[], int]) -> None:
        self.written = written
        self.calls: list[int] = []

    def before_reply(self) -> None:
        self.calls.append(self.written())
        if len(self.calls) == 1:
            raise RuntimeError("injected AOF failure")


def test_replies_wait_for_the_end_of_the_turn_and_survive_a_failing_aof() -> None:
    async def main() -> None:
        node = Node()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: None)  # the injected failure
        aof = FailingOnceAOF(lambda: len(transport.written))
        node.state.persistence = aof  # type: ignore[assignment]
        node.state.logging_persistence = aof  # type: ignore[assignment]
        calls = aof.calls
        conn, transport = connect(node)
        conn.data_received(b"PING\r\nECHO a\r\n")
        assert transport.written == b""                 # not from the read callback
        await _until(lambda: transport.written)
        assert transport.written == b"+PONG\r\n$1\r\na\r\n"
        assert calls == [0]                              # the AOF ran before the write
        conn.data_received(b"PING\r\n")                 # the connection still works
        await _until(lambda: transport.written.count(b"+PONG") == 2)
        assert transport.written == b"+PONG\r\n$1\r\na\r\n+PONG\r\n"

    asyncio.run(main())


def test_a_closed_connection_lets_go_of_its_transport() -> None:
    """The connection binds the transport's write and is_closing (a method
    call by name from compiled code costs a lookup per reply); the bound
    methods hold the transport, and the transport holds the connection, so
    connection_lost must drop them or every closed client would leave a
    cycle for the collector, which the node runs rarely (cyclic_gc)."""
    async def main() -> None:
        node = Node()
        conn, transport = connect(node)
        conn.data_received(b"PING\r\n")
        assert transport.written == b"+PONG\r\n"    # written through the bound write
        gone = weakref.ref(transport)
        conn.connection_lost(None)
        del transport
        gc.disable()
        try:
            assert gone() is None, gc.get_referrers(gone())
        finally:
            gc.enable()
        conn.data_received(b"PING\r\n")              # a late read writes nothing, raises nothing
    asyncio.run(main())


def test_replies_before_quit_are_written_before_the_close() -> None:
    async def main() -> None:
        node = Node()
        conn, transport = connect(node)
        conn.data_received(b"PING\r\nQUIT\r\nPING\r\n")
        assert transport.written == b"+PONG\r\n+OK\r\n" and transport.closed

    asyncio.run(main())


def test_jobs_share_equal_time_objects_and_the_table_stays_bounded() -> None:
    from disque.state import SHARED_INTS

    node = Node()
    a = node.job(node("ADDJOB", "q", "a", 0, "TTL", 3600).encode())
    b = node.job(node("ADDJOB", "q", "b", 0, "TTL", 3600).encode())
    assert a.etime == b.etime
    state = node.state
    big = 10 ** 15
    if _native.activate() != "compiled":
        # Interpreted, equal times share one int object (same ms, same TTL).
        # Compiled, a Job's int fields are stored unboxed in the object, so
        # there is no object to share (nor any memory to save).
        assert a.etime is b.etime
        assert state.shared_int(big + 1) is state.shared_int(int(str(big + 1)))
    for i in range(3 * SHARED_INTS):
        state.shared_int(big + i)
    assert len(state._shared_ints) <= SHARED_INTS


def test_acked_long_lived_jobs_leave_no_heap_keys_behind() -> None:
    """RETRY-0 jobs wake at their expiry; acking them early must not leave one key each."""
    node = Node()
    for _ in range(5000):
        job_id = node("ADDJOB", "q", "x", 0, "RETRY", 0, "REPLICATE", 1, "TTL", 86400)
        node("GETJOB", "FROM", "q")
        node("ACKJOB", job_id)
        node.clock.advance(16)  # a new 16 ms bucket for every job's expiry
    schedule = node.state.jobs.schedule
    assert len(node.state.jobs) == 0 and len(schedule) == 0
    assert schedule.numbers_held <= 1024


def test_a_failing_job_stays_scheduled(monkeypatch: pytest.MonkeyPatch) -> None:
    from disque import timers as jobs_module

    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 1).encode()
    node("GETJOB", "FROM", "q")
    real = jobs_module.process_job

    def broken(state, job, now):
        raise RuntimeError("injected")

    monkeypatch.setattr(jobs_module, "process_job", broken)
    node.advance(2000)                      # the requeue fails: logged, job kept
    assert node.job(job_id).awakeme > 0
    monkeypatch.setattr(jobs_module, "process_job", real)
    node.advance(2000)
    assert node("QLEN", "q") == 1           # and it happens once the bug is gone


def test_a_long_pending_pipeline_is_written_over_several_turns() -> None:
    """Commands queued behind a block run in slices, so back-pressure can act in between."""
    from disque.connection import DRAIN_OUTPUT_LIMIT

    async def main() -> None:
        node = Node()
        conn, transport = connect(node)
        payload = b"p" * 1024
        count = 1000                     # ~1 MB of replies, four times the slice
        conn.data_received(b"*3\r\n$6\r\nGETJOB\r\n$4\r\nFROM\r\n$5\r\ndrain\r\n"
                           + b"".join(b"*2\r\n$4\r\nECHO\r\n$1024\r\n%s\r\n" % payload
                                      for _ in range(count)))
        assert conn.blocked is not None
        node("ADDJOB", "drain", "job", 0)  # serves the blocked GETJOB
        echo = b"$1024\r\n" + payload + b"\r\n"
        await _until(lambda: echo in transport.written)
        first = transport.written.count(echo)
        assert 0 < first < count and first * len(echo) <= 2 * DRAIN_OUTPUT_LIMIT
        await _until(lambda: transport.written.count(echo) == count)
        assert transport.written.startswith(b"*1\r\n*3\r\n$5\r\ndrain\r\n")

    asyncio.run(main())


# --------------------------------------------------------------------------
# The replication latency histogram, and the pick of a job's copy nodes
# --------------------------------------------------------------------------

def test_latency_histogram_buckets_agree_with_bisect() -> None:
    import bisect

    from disque.latency import REPLICATION_BUCKETS_S, LatencyHistogram

    values = [0.0, 0.0001, *REPLICATION_BUCKETS_S, 0.0007, 0.003, 0.7, 9.99, 10.0001, 1e9]
    histogram = LatencyHistogram(REPLICATION_BUCKETS_S)
    expected = [0] * (len(REPLICATION_BUCKETS_S) + 1)
    for value in values:
        histogram.observe(value)
        expected[bisect.bisect_left(REPLICATION_BUCKETS_S, value)] += 1
    assert histogram.counts == expected
    # A bound belongs to its own bucket (Prometheus's le), +Inf takes the rest.
    assert histogram.counts[0] == 3 and histogram.counts[-1] == 2
    assert histogram.total == pytest.approx(sum(values))


def test_random_pick_takes_distinct_candidates_and_every_one_in_turn() -> None:
    from disque.replication import _random_pick

    candidates = [f"node{i}" for i in range(5)]
    seen: dict[str, int] = dict.fromkeys(candidates, 0)
    for _ in range(2000):
        for count in (1, 2, 4):
            chosen = _random_pick(candidates, count)
            assert len(chosen) == count == len(set(chosen))
            assert set(chosen) <= set(candidates)
        [one] = _random_pick(candidates, 1)
        seen[one] += 1
    assert candidates == [f"node{i}" for i in range(5)]  # the caller's list is left alone
    # 2000 draws of 1 in 5: each near 400; below 300 would be a broken shuffle.
    assert min(seen.values()) > 300, seen


# --------------------------------------------------------------------------
# RecentAcks: the ring of IDs acked lately (WAITJOB)
# --------------------------------------------------------------------------

def test_recent_acks_forget_by_age_and_by_count_across_the_ring() -> None:
    from disque.acked_ids import RECENT_ACK_MAX, RECENT_ACK_MS, RecentAcks

    acks = RecentAcks()
    acks.add(b"first", 1000)
    acks.add(b"second", 1500)
    assert acks.acked(b"first", 1000 + RECENT_ACK_MS - 1) and len(acks) == 2
    # An ack at the first one's expiry forgets it, not the second.
    acks.add(b"third", 1000 + RECENT_ACK_MS)
    assert b"first" not in acks and b"second" in acks and len(acks) == 2
    # Past the count, the oldest go first, however recent; many times
    # around the ring, the table and the ring stay bounded and agree.
    now = 2000
    total = 3 * RECENT_ACK_MAX + 17
    for i in range(total):
        acks.add(b"%d" % i, now)
    assert len(acks) == RECENT_ACK_MAX
    assert b"%d" % (total - RECENT_ACK_MAX - 1) not in acks
    assert all(b"%d" % i in acks for i in range(total - RECENT_ACK_MAX, total))
    assert b"second" not in acks and b"third" not in acks


def test_recent_acks_an_id_acked_again_keeps_its_later_time() -> None:
    from disque.acked_ids import RECENT_ACK_MAX, RECENT_ACK_MS, RecentAcks

    acks = RecentAcks()
    acks.add(b"again", 0)
    acks.add(b"other", 10)
    acks.add(b"again", 20)
    # The first slot of "again" expires at RECENT_ACK_MS; the ID stays
    # until its second ack's time.
    acks.add(b"late", RECENT_ACK_MS + 15)
    assert acks.acked(b"again", RECENT_ACK_MS + 15) and b"other" not in acks
    acks.add(b"later", RECENT_ACK_MS + 20)
    assert b"again" not in acks
    # Re-acking one ID over and over never takes more than the ring.
    for i in range(RECENT_ACK_MAX + 5):
        acks.add(b"same", RECENT_ACK_MS + 30 + i // 1000)
    assert acks.acked(b"same", RECENT_ACK_MS + 30) and len(acks) <= 3



def test_recent_acks_hold_nothing_for_the_acks_they_forgot() -> None:
    """Expired slots let go of their objects: what the ring keeps follows
    the IDs remembered, not how many went through since the ring last
    came round (a node's RSS grew for an hour at 15 ACKs a second)."""
    from disque.acked_ids import RECENT_ACK_MS, RecentAcks

    acks = RecentAcks()
    start = 1_800_000_000_000  # a unix time in ms: not one of the cached small ints
    acks.add(b"warm-up: allocates the ring", start)
    acked = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(acked):
            # Each ack comes after the previous one's expiry: one ID remembered.
            acks.add(b"%040d" % i, start + (i + 1) * (RECENT_ACK_MS + 1))
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(acks) == 1
    # Holding a time per forgotten ack would be 32 bytes each (640 kB here).
    assert retained < 64 * 1024, retained


def test_memory_levels_keep_the_originals_thresholds_for_limits_of_any_size() -> None:
    """The levels compare against thresholds worked out when the limit is
    set: the same answers as the original's ``used * 20 <= limit * 15``
    (75%) and ``* 19`` (95%), at each boundary, for tiny and huge limits."""
    from disque.memory import MemoryTracker

    tracker = MemoryTracker(0, startup=0)
    for limit in (1, 7, 3 * 2 ** 20, 20 * 10 ** 9, 2 ** 62 + 3, 10 ** 20):
        tracker.set_maxmemory(limit)       # as CONFIG SET maxmemory does
        edges = (limit * 15 // 20, limit * 19 // 20, limit)
        for used in {max(0, edge + step) for edge in edges for step in (-1, 0, 1)}:
            tracker.accounted = used
            expected = (0 if used * 20 <= limit * 15 else 1 if used * 20 <= limit * 19
                        else 2 if used < limit else 3)
            assert tracker.level() == expected, (limit, used)


def test_creation_times_are_milliseconds_times_a_million_and_increase() -> None:
    """next_ctime computes ``ms * 10**6`` from two small products (so that a
    compiled node stays on machine integers): the value must be the plain
    product, for this century's clocks and the edges of its split, and
    strictly increasing within one millisecond."""
    state = Node().state
    rng = random.Random(7)
    now = int(time.time() * 1000)
    samples = sorted({0, 1, 0xFFFF, 0x10000, 2**31 - 1, 2**31, now, now + 1,
                      *(rng.randrange(2**40, 2**46) for _ in range(2000))})
    last = 0  # a new node's: the first creation time is at least 1
    for ms in samples:
        ctime = state.next_ctime(ms)
        assert ctime == max(ms * 1_000_000, last + 1)
        last = ctime
    assert [state.next_ctime(samples[-1]) for _ in range(3)] == [last + 1, last + 2, last + 3]


# --------------------------------------------------------------------------
# GETJOB replies encoded ahead
# --------------------------------------------------------------------------

@pytest.mark.parametrize("resp3", [False, True])
def test_fielded_getjob_entries_encode_as_the_generic_encoder_does(resp3: bool) -> None:
    """WITHCOUNTERS and WITHHEADERS replies are encoded ahead, bypassing the
    generic encoder: byte for byte what it makes of getjob_entry's lists,
    for plain jobs, headers (empty values, large ones), counters past the
    small-integer table, and IDs of another length than this node's."""
    from disque.job_options import JobExt
    from disque.protocol import encode
    from disque.queue_table import Queue
    from disque.waiters import (
        WITH_COUNTERS,
        WITH_HEADERS,
        fielded_entries_reply,
        getjob_entry,
    )

    ids = JobIdGenerator(NODE)
    q = Queue(b"orders", 0)
    plain = Job(ids.next_id(3600, 60), b"orders", b"x" * 2000)
    with_headers = Job(ids.next_id(3600, 60), b"orders", b"")
    with_headers.ext = JobExt(headers=(b"traceparent", b"00-abc-01", b"empty", b"",
                                       b"big", b"v" * 5000))
    counted = Job(ids.next_id(3600, 60), b"orders", b"body")
    counted.nacks, counted.additional_deliveries = 5000, 3
    odd_id = Job(b"D-not-an-id-of-this-node", b"orders", b"y")
    jobs = [plain, with_headers, counted, odd_id]
    for fields in (WITH_COUNTERS, WITH_HEADERS, WITH_COUNTERS | WITH_HEADERS):
        for chosen in (jobs, jobs[1:2]):
            expected = encode([getjob_entry(job, fields) for job in chosen], resp3)
            assert fielded_entries_reply(q, chosen, fields).raw == expected, (fields, chosen)
