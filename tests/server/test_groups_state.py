"""Ordered groups (``ADDJOB ... GROUP``, disque/groups.py) in-process on a
manual clock (``statekit``): random sequences of every operation that moves
a job, with the guarantee checked at each delivery and the books checked
against the jobs after every step.

The guarantee (docs/EXTENSIONS.md, "Ordered groups"), for each queue and key:
no job of a group is handed out while another of its jobs is active on the
node (delivered, dequeued, waiting for a NACK's delay), unless both are in
the same GETJOB reply; and a job is handed out only after every older job
of its group still on the node, earlier in the same reply.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from disque.groups import GROUP_BYTES, TABLE_BYTES
from disque.job import FLAG_GROUP_COPY, FLAG_GROUP_OUT, Job, JobState
from disque.protocol import NULL_ARRAY
from disque.queue_table import QUEUE_ENTRY_BYTES

from .statekit import Node

QUEUES = ("q1", "q2")
KEYS = ("A", "B", "C")


def group_of(job: Job) -> bytes | None:
    return job.ext.group if job.ext is not None else None


def entries(reply: Any) -> list[list[Any]]:
    return [] if reply is None or reply is NULL_ARRAY else list(reply)


def check_books(node: Node) -> None:
    """Every queue's group books agree with its jobs (groups.py's rule)."""
    state = node.state
    jobs = list(state.jobs.all())
    for q in state.queues.all():
        queued = [j for j in jobs if j.queue == q.name and j.state == JobState.QUEUED]
        assert len(q) == len(queued), q.name
        table = q.groups
        grouped = [j for j in jobs if j.queue == q.name and group_of(j) is not None
                   and (j.state == JobState.QUEUED or j.flags & (FLAG_GROUP_OUT
                                                                 | FLAG_GROUP_COPY))]
        if table is None:
            assert not grouped, (q.name, grouped)
            continue
        keys = {group_of(j) for j in grouped}
        assert set(table.by_key) == keys, "a group without jobs, or jobs without their group"
        held = blocked = waiting_total = 0
        eligible = {id(j) for j in q.jobs.first(len(q.jobs))}
        for key, group in table.by_key.items():
            members = [j for j in grouped if group_of(j) == key]
            out = [j for j in members if j.flags & FLAG_GROUP_OUT]
            assert all(j.state == JobState.ACTIVE for j in out)
            assert group.out == len(out)
            copies = [j for j in members if j.flags & FLAG_GROUP_COPY]
            assert all(j.state == JobState.ACTIVE and not j.flags & FLAG_GROUP_OUT
                       for j in copies)
            line = group.copies
            assert (line.jobs[line.first:] if line is not None else []) == sorted(
                copies, key=lambda j: j.ctime)
            waiting = group.waiting.jobs[group.waiting.first:]
            assert [j.ctime for j in waiting] == sorted(j.ctime for j in waiting)
            assert all(j.state == JobState.QUEUED for j in waiting)
            in_queue = [j for j in members if j.state == JobState.QUEUED]
            assert len(in_queue) == len(waiting) + (group.head is not None)
            if out:
                assert group.head is None
                held += 1
            elif in_queue:
                oldest = min(in_queue, key=lambda j: j.ctime)
                if copies and min(j.ctime for j in copies) < oldest.ctime:
                    assert group.head is None  # behind an older copy
                else:
                    assert group.head is oldest
            if group.head is not None:
                assert id(group.head) in eligible
            for job in waiting:
                assert id(job) not in eligible
            if waiting and group.head is None:
                blocked += 1
                assert key in table.blocked
            else:
                assert key not in table.blocked
            waiting_total += len(waiting)
        assert table.held == held and len(table.blocked) == blocked
        assert table.waiting == waiting_total


def check_delivery(node: Node, reply: list[list[Any]]) -> None:
    """Exclusivity and order for the jobs of one GETJOB reply."""
    jobs = list(node.state.jobs.all())
    in_reply = {entry[1] for entry in reply}
    taken: list[bytes] = []
    for entry in reply:
        job = node.job(entry[1])
        assert job is not None
        key = group_of(job)
        if key is not None:
            for other in jobs:
                if other is job or other.queue != job.queue or group_of(other) != key:
                    continue
                if other.state == JobState.ACTIVE:
                    assert other.id in in_reply, "two jobs of a group out at once"
                if other.state != JobState.ACKED and other.ctime < job.ctime:
                    assert other.id in taken, "a group's job went out before an older one"
        taken.append(job.id)


class Run:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.node = Node()
        self.ids: list[bytes] = []
        self.out: list[bytes] = []  # delivered, as the consumer sees it

    def add(self) -> None:
        rng = self.rng
        opts: list[Any] = ["RETRY", rng.choice((2, 3, 5))]
        if rng.random() < 0.2:
            opts += ["TTL", rng.choice((8, 30))]
        if rng.random() < 0.2:
            opts += ["PRIORITY", rng.choice((1, 5))]
        if rng.random() < 0.15:
            opts += ["MAXDELIVERIES", 3]
        queue = rng.choice(QUEUES)
        if rng.random() < 0.15:
            groups = [rng.choice(KEYS) for _ in range(rng.randint(1, 4))]
            args: list[Any] = ["ADDJOBS", queue, 0, *opts, "GROUPS"]
            for i, key in enumerate(groups):
                args += [key, f"bulk-{i}"]
            self.ids += [job_id.encode() if isinstance(job_id, str) else job_id
                         for job_id in self.node(*args)]
            return
        if rng.random() < 0.85:
            opts += ["GROUP", rng.choice(KEYS)]
        self.ids.append(str(self.node("ADDJOB", queue, "body", 0, *opts)).encode())

    def get(self) -> None:
        rng = self.rng
        queues = rng.choice((["q1"], ["q2"], ["q1", "q2"], ["q2", "q1", "q2"]))
        reply = entries(self.node("GETJOB", "NOHANG", "COUNT", rng.randint(1, 4), "FROM",
                                  *queues))
        check_delivery(self.node, reply)
        self.out += [entry[1] for entry in reply]

    def settle(self, command: str, *tail: Any) -> None:
        """``command`` on a job the consumer got (an error if it is gone meanwhile)."""
        if not self.out:
            return
        index = self.rng.randrange(len(self.out))
        job_id = self.out[index] if command == "WORKING" else self.out.pop(index)
        self.node.raw(command, job_id, *tail)

    def by_id(self, command: str) -> None:
        if self.ids:
            self.node.raw(command, self.rng.choice(self.ids))

    def step(self) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.30:
            self.add()
        elif choice < 0.55:
            self.get()
        elif choice < 0.65:
            self.settle("ACKJOB")
        elif choice < 0.70:
            self.settle("FASTACK")
        elif choice < 0.76:
            self.settle("NACK")
        elif choice < 0.78:
            self.settle("NACK", "DELAY", rng.choice((0, 1, 4)))
        elif choice < 0.80:
            self.settle("WORKING")
        elif choice < 0.83:
            self.by_id("DEQUEUE")
        elif choice < 0.86:
            self.by_id("ENQUEUE")
        elif choice < 0.88:
            self.by_id("DELJOB")
        else:
            self.node.advance(rng.choice((300, 1000, 2500, 6000)))
        check_books(self.node)


@pytest.mark.parametrize("seed", range(25))
def test_random_operations_keep_order_exclusivity_and_books(seed: int) -> None:
    run = Run(seed)
    for _ in range(400):
        run.step()
    # Liveness: consumers that acknowledge everything drain every group.
    node = run.node
    for _ in range(400):
        reply = entries(node("GETJOB", "NOHANG", "COUNT", 3, "FROM", *QUEUES, "q1:dead",
                             "q2:dead"))
        check_delivery(node, reply)
        for entry in reply:
            node("ACKJOB", entry[1])
        check_books(node)
        if not reply:
            node.advance(3000)
        if not any(j.state != JobState.ACKED for j in node.state.jobs.all()):
            break
    assert all(j.state == JobState.ACKED for j in node.state.jobs.all()), "a group got stuck"
    assert all(q.groups is None for q in node.state.queues.all())


def test_the_books_count_in_used_memory_and_go_back_to_nothing() -> None:
    node = Node()
    memory = node.state.memory
    node("ADDJOB", "q", "warm", 0)
    node("ACKJOB", node("QPEEK", "q", 1)[0][1])
    before = memory.accounted
    ids = [str(node("ADDJOB", "q", f"j{i}", 0, "GROUP", key)).encode()
           for i, key in enumerate(("k1", "k1", "k2"))]
    jobs = sum(_job_bytes(node.job(job_id)) for job_id in ids)
    assert memory.accounted - before == (jobs + 3 * QUEUE_ENTRY_BYTES + TABLE_BYTES
                                         + 2 * (GROUP_BYTES + 2))
    reply = node("GETJOB", "COUNT", 3, "FROM", "q")
    assert len(reply) == 3
    for entry in reply:
        node("ACKJOB", entry[1])
    assert memory.accounted == before
    assert node.state.queues.lookup(b"q").groups is None


def _job_bytes(job: Job) -> int:
    from disque.job_table import job_memory
    return job_memory(job)


def test_the_group_overheads_match_what_python_allocates() -> None:
    """GROUP_KEY_BYTES and EXT_BYTES per job, GROUP_BYTES per group,
    COPIES_BYTES per group with copies, against
    tracemalloc (interpreted objects: the compiled ones are smaller)."""
    import tracemalloc

    from disque.groups import COPIES_BYTES, ByAge, Group
    from disque.job_options import JobExt
    from disque.job_table import EXT_BYTES, GROUP_KEY_BYTES

    count = 4000
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        exts = [JobExt(group=b"group-%06d" % i) for i in range(count)]
        per_job = (tracemalloc.get_traced_memory()[0] - base) / count - 12
        base = tracemalloc.get_traced_memory()[0]
        table: dict[bytes, Group] = {}
        for i in range(count):
            key = b"key-%08d" % i
            table[key] = Group(key)
        per_group = (tracemalloc.get_traced_memory()[0] - base) / count - 12
        base = tracemalloc.get_traced_memory()[0]
        lines = [ByAge() for _ in range(count)]
        for line in lines:
            line.jobs.append(exts[0])  # type: ignore[arg-type]
        per_copies = (tracemalloc.get_traced_memory()[0] - base) / count - 8
        del exts, table, lines
    finally:
        tracemalloc.stop()
    expected_job = GROUP_KEY_BYTES + EXT_BYTES
    assert abs(per_job - expected_job) < 0.25 * expected_job, per_job
    assert abs(per_group - GROUP_BYTES) < 0.25 * GROUP_BYTES, per_group
    assert abs(per_copies - COPIES_BYTES) < 0.25 * COPIES_BYTES, per_copies


def test_the_record_carries_the_group_as_version_4() -> None:
    from disque.job_options import (
        JobExt,
        apply_bus_trailer,
        bus_trailer,
        decode_record,
        decode_stored,
        encode_record,
        stored_form,
    )

    ext = JobExt(priority=3, group=b"order-42")
    record = encode_record(ext)
    assert record[3] == 4 and decode_record(record) == (ext, len(record))
    # Without headers, the headers' count (0) comes before the key.
    assert record.endswith(b"\x00\x00\x00\x00\x08\x00\x00\x00order-42")
    # Without a group: version 2 (or 3 with headers), byte for byte as before.
    assert encode_record(JobExt(priority=3))[3] == 2
    with_headers = JobExt(headers=(b"k", b"v"))
    assert encode_record(with_headers)[3] == 3
    both = JobExt(headers=(b"k", b"v"), group=b"g")
    assert encode_record(both).startswith(encode_record(with_headers)[:3])
    assert decode_record(encode_record(both))[0] == both
    # The AOF's form and the bus trailer carry it.
    job = Job(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", b"q", b"body", ctime=1,
              etime=10_000_000, retry=30)
    job.ext = ext
    assert decode_stored(stored_form(job)).ext == ext
    copy = Job(job.id, b"q", b"body")
    apply_bus_trailer([copy], bus_trailer([job]), 0)
    assert copy.ext == ext
    # A job's group-out flag is this node's memory: never serialized.
    job.flags |= FLAG_GROUP_OUT
    assert not decode_stored(stored_form(job)).flags & FLAG_GROUP_OUT


def test_a_reload_queues_each_group_whole_at_its_first_retry() -> None:
    """Jobs read back from the AOF come back active, as copies of their group
    (groups.py): nothing of the group goes out until the first RETRY among
    them comes, which queues all of them, and the group goes out in add
    order, whatever order the RETRYs fell in."""
    from disque.job_options import decode_stored, stored_form
    from disque.restore import apply_loaded_jobs

    before = Node()
    ids = [str(before("ADDJOB", "q", f"a{i}", 0, "GROUP", "A", "RETRY", retry)).encode()
           for i, retry in enumerate((4, 8, 2))]
    assert before("GETJOB", "FROM", "q")[0][1] == ids[0]
    loaded = [decode_stored(stored_form(job)) for job in before.state.jobs.all()]
    after = Node()
    apply_loaded_jobs(after.state, reversed(loaded), restore_queues=False)
    check_books(after)

    def fetch() -> list[bytes]:
        return [entry[1] for entry in entries(after("GETJOB", "NOHANG", "COUNT", 5,
                                                    "FROM", "q"))]

    after.advance(1_500)  # no RETRY came yet: all three are copies
    assert after("QLEN", "q") == 0 and fetch() == []
    after.advance(1_000)  # a2's RETRY: the whole group is queued, in its order
    assert after("QLEN", "q") == 3
    check_books(after)
    assert fetch() == ids
    check_books(after)


def test_at_most_once_jobs_do_not_hold_their_group_after_a_reload() -> None:
    from disque.job_options import decode_stored, stored_form
    from disque.restore import apply_loaded_jobs

    before = Node()
    once = str(before("ADDJOB", "q", "once", 0, "GROUP", "A", "RETRY", 0)).encode()
    later = str(before("ADDJOB", "q", "later", 0, "GROUP", "A", "RETRY", 2)).encode()
    loaded = [decode_stored(stored_form(job)) for job in before.state.jobs.all()]
    after = Node()
    apply_loaded_jobs(after.state, loaded, restore_queues=False)
    after.advance(3_000)
    # A reload never queues a RETRY-0 job again: it does not hold its group.
    assert [e[1] for e in after("GETJOB", "NOHANG", "FROM", "q")] == [later]
    assert after.job(once).state == JobState.ACTIVE
