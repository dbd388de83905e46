"""Dead letters made the way the node makes them, and a consumer that counts what it gets.

Shared by the console's tests and the CLI's redrive tests: every check of
"none lost, none duplicated" counts the bodies a real consumer received.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from disque import Client
from tests.support.process import DisqueProcess, wait_for


def node_client(node: DisqueProcess, **kwargs: object) -> Client:
    return Client(f"127.0.0.1:{node.port}", randomize=False, **kwargs)  # type: ignore[arg-type]


def make_dead_letters(node: DisqueProcess, queue: str, bodies: Sequence[bytes],
                      password: str | None = None, **options: object) -> list[str]:
    """Add ``bodies`` to ``queue`` on ``node`` with MAXDELIVERIES 1, take and
    NACK them until all are in ``queue:dead`` (or their DEADLETTER queue); their IDs."""
    dead = str(options.get("dead_letter") or queue + ":dead")
    with node_client(node, password=password) as c:
        before = c.qlen(dead)
        ids = c.add_jobs(queue, list(bodies), retry=1, max_deliveries=1, **options)

        def moved() -> bool:
            jobs = c.get_jobs(queue, count=500, nohang=True)
            if jobs:
                c.nack(*[j.id for j in jobs])
            return c.qlen(dead) == before + len(bodies)

        wait_for(moved, 30, message=f"{len(bodies)} jobs of {queue} to be dead-lettered")
    return ids


def registered_jobs(nodes: Sequence[DisqueProcess]) -> int:
    total = 0
    for node in nodes:
        with node_client(node) as c:
            total += int(c.info("jobs")["jobs"]["registered_jobs"])
    return total


def jobs_left(nodes: Sequence[DisqueProcess], *queues: str) -> int:
    """Copies of jobs of ``queues`` still held by any node, in any state."""
    total = 0
    for node in nodes:
        with node_client(node) as c:
            for queue in queues:
                total += sum(1 for _ in c.jscan(queue=queue))
    return total


def queue_length(nodes: Sequence[DisqueProcess], queue: str) -> int:
    total = 0
    for node in nodes:
        with node_client(node) as c:
            total += c.qlen(queue)
    return total


class Consumer:
    """One thread per node: GETJOB from ``queue``, record the body, ACKJOB."""

    def __init__(self, nodes: Sequence[DisqueProcess], queue: str,
                 password: str | None = None) -> None:
        self.queue = queue
        self.password = password
        self.bodies: Counter[bytes] = Counter()
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True)
                         for n in nodes]

    def _run(self, node: DisqueProcess) -> None:
        try:
            with node_client(node, password=self.password) as c:
                while not self._stop.is_set():
                    jobs = c.get_jobs(self.queue, count=20, timeout_ms=200)
                    with self._lock:
                        self.bodies.update(j.body for j in jobs)
                    if jobs:
                        c.ack(*[j.id for j in jobs])
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def start(self) -> Consumer:
        for thread in self._threads:
            thread.start()
        return self

    def received(self) -> int:
        with self._lock:
            return sum(self.bodies.values())

    def stop(self) -> Counter[bytes]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not self.errors, self.errors
        return self.bodies


def assert_each_once(bodies: Counter[bytes], expected: Sequence[bytes]) -> None:
    """Every expected body received, none twice, nothing else."""
    twice = {b: n for b, n in bodies.items() if n > 1}
    assert not twice, f"delivered more than once: {sorted(twice.items())[:5]}"
    missing = set(expected) - set(bodies)
    assert not missing, f"{len(missing)} never delivered, e.g. {sorted(missing)[:5]}"
    extra = set(bodies) - set(expected)
    assert not extra, f"unexpected bodies: {sorted(extra)[:5]}"
