"""An ordered group after the failure of the node that serves it
(docs/EXTENSIONS.md, "Ordered groups", "In a cluster"): three real nodes,
the group's home killed with SIGKILL.  Exactly one surviving node, the best
ranked for the key, queues the group again, whole and in add order; the
jobs the client adds meanwhile (at that same node) go after them; and from
then on consumers on every node get the group's jobs one at a time, in add
order."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

from disque import Client
from disque.rendezvous import ranking
from tests.support.cluster import node_id, show
from tests.support.process import DisqueProcess, wait_for

RETRY = 2


def keys_served_by(ids: Sequence[str], home: str, per_second: int) -> list[str]:
    """Keys whose home is ``home``: ``per_second`` for each other node as
    the next one (both survivors take groups over)."""
    found: dict[str, list[str]] = {}
    for i in range(10_000):
        key = f"g-{i}"
        ranked = ranking(key.encode(), ids)
        if ranked[0] == home and len(found.setdefault(ranked[1], [])) < per_second:
            found[ranked[1]].append(key)
        if len(found) == len(ids) - 1 and all(len(v) == per_second for v in found.values()):
            break
    return [key for keys in found.values() for key in keys]


def queued_on(node: DisqueProcess, queue: str) -> list[bytes]:
    """IDs of the jobs ``node`` holds queued in ``queue`` (JSCAN)."""
    cursor, found = b"0", []
    client = node.client()
    while True:
        cursor, ids = client.execute_command("JSCAN", cursor, "QUEUE", queue, "STATE", "queued")
        found += ids
        if cursor in (b"0", 0):
            return found


class Consumers:
    """Consumers on given nodes: GETJOB (one job), a short piece of work,
    ACKJOB; every delivery recorded with the time it was held."""

    def __init__(self, nodes: Sequence[DisqueProcess], per_node: int = 2,
                 work_s: float = 0.03) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        #: (job ID, group, consumer, held from, held until)
        self.held: list[tuple[bytes, bytes, str, float, float]] = []
        self.work_s = work_s
        self.threads = [threading.Thread(target=self._run, args=(node, f"{node.port}/{i}"),
                                         daemon=True)
                        for node in nodes for i in range(per_node)]
        for thread in self.threads:
            thread.start()

    def _run(self, node: DisqueProcess, name: str) -> None:
        client = node.client()
        while not self.stop.is_set():
            reply = client.execute_command("GETJOB", "TIMEOUT", 100, "WITHGROUP", "FROM", "q")
            if not reply:
                continue
            for entry in reply:
                start = time.monotonic()  # the reply arrived: the job is ours
                time.sleep(self.work_s)
                end = time.monotonic()  # before the ACK leaves: still ours until here
                client.execute_command("ACKJOB", entry[1])
                with self.lock:
                    self.held.append((entry[1], entry[-1], name, start, end))

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)

    def by_group(self) -> dict[bytes, list[tuple[bytes, bytes, str, float, float]]]:
        with self.lock:
            held = sorted(self.held, key=lambda h: h[3])
        groups: dict[bytes, list[Any]] = {}
        for entry in held:
            groups.setdefault(entry[1], []).append(entry)
        return groups


def check_order_and_exclusivity(consumers: Consumers, added: dict[str, list[bytes]]) -> None:
    groups = consumers.by_group()
    for key, ids in added.items():
        held = groups.get(key.encode(), [])
        order = [h[0] for h in held]
        # At least once: a job may come twice, never out of its place.
        assert [job for i, job in enumerate(order) if i == 0 or order[i - 1] != job] == ids, key
        # A job may come again when its RETRY ran out while it was held (the
        # node counts it from when the job was last queued): at least once.
        # Its first ACK moves the group on, so a job is held from its first
        # delivery to the first ACK sent for it; no two jobs may overlap.
        spans: dict[bytes, tuple[float, float]] = {}
        for job, _key, _who, start, end in held:
            first = spans.get(job, (start, end))
            spans[job] = (min(first[0], start), min(first[1], end))
        ordered = sorted(spans.items(), key=lambda item: item[1][0])
        for before, after in itertools.pairwise(ordered):
            assert after[1][0] >= before[1][1], \
                f"two consumers held jobs of {key} at once: {before} and {after}"


def test_one_survivor_requeues_the_whole_group_in_order(make_cluster) -> None:
    nodes = make_cluster(3)
    ids = [node_id(n) for n in nodes]
    by_id = dict(zip(ids, nodes, strict=True))
    home = ids[1]
    keys = keys_served_by(ids, home, per_second=2)
    survivors = [n for n in nodes if node_id(n) != home]
    added: dict[str, list[bytes]] = {}
    with Client([f"127.0.0.1:{n.port}" for n in nodes]) as client:
        for key in keys:
            added[key] = [client.add_job("q", b"%s-%d" % (key.encode(), i), group=key,
                                         replicate=3, retry=RETRY).encode()
                          for i in range(4)]
        for key in keys:
            for job_id in added[key]:
                assert show(by_id[home], job_id)[b"state"] == b"queued"
        by_id[home].kill()
        # The client moves the groups' new jobs to their next node by rank,
        # which holds copies of the older ones: the new ones wait behind them.
        for key in keys:
            added[key] += [client.add_job("q", b"%s-late" % key.encode(), group=key,
                                          replicate=2, retry=RETRY).encode()]

    def all_queued() -> bool:
        return sum(len(queued_on(n, "q")) for n in survivors) == sum(map(len, added.values()))

    # RETRY, the node timeout and the wait by rank (2 s a node): well within 30 s.
    wait_for(all_queued, timeout=30, interval=0.1, message="the groups queued again")
    for key, job_ids in added.items():
        taker = by_id[ranking(key.encode(), ids)[1]]
        other = next(n for n in survivors if n is not taker)
        assert set(job_ids) <= set(queued_on(taker, "q")), key
        assert not set(job_ids) & set(queued_on(other, "q")), key
        # The other survivor keeps its copies as copies (active).
        for job_id in added[key][:4]:
            assert show(other, job_id)[b"state"] == b"active"
    consumers = Consumers(survivors)
    try:
        wait_for(lambda: sum(len(v) for v in consumers.by_group().values())
                 >= sum(map(len, added.values())), timeout=60, interval=0.1,
                 message="every job delivered and acknowledged")
    finally:
        consumers.close()
    check_order_and_exclusivity(consumers, added)


def test_a_held_job_of_the_dead_home_comes_back_first(make_cluster) -> None:
    """A job out on the home when it dies (its consumer gone with it) is
    the group's first job again on the node that takes the group over."""
    nodes = make_cluster(3)
    ids = [node_id(n) for n in nodes]
    by_id = dict(zip(ids, nodes, strict=True))
    home = ids[2]
    key = keys_served_by(ids, home, per_second=1)[0]
    taker = by_id[ranking(key.encode(), ids)[1]]
    with Client([f"127.0.0.1:{n.port}" for n in nodes]) as client:
        job_ids = [client.add_job("q", b"%d" % i, group=key, replicate=3,
                                  retry=RETRY).encode() for i in range(3)]
    got = by_id[home].client().execute_command("GETJOB", "FROM", "q")
    assert [e[1] for e in got] == job_ids[:1]
    by_id[home].kill()
    wait_for(lambda: len(queued_on(taker, "q")) == 3, timeout=30, interval=0.1,
             message="the group queued again")
    reply = taker.client().execute_command("GETJOB", "COUNT", 10, "FROM", "q")
    assert [e[1] for e in reply] == job_ids
