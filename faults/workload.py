"""Producers, consumers and the GC observer, each operation recorded.

Clients are raw redis-py connections, one per (worker, node), rather than
``disque.Client``: the client library moves to another node on errors,
retries commands (a re-sent ADDJOB is a second job) and routes ACKs by job
ID, which would hide which node answered what.  The checker needs exactly
one recorded operation per command sent to one known node, so redis-py's
own retries are off as well.

Consumers have roles: ``normal`` (ACK at once, NACK now and then), ``slow``
(work up to 1.5 x RETRY before the ACK, so some jobs come back on RETRY
expiry) and ``crashy`` (drop the connection before the ACK now and then,
as a consumer that crashes does).

With ``groups`` (``--groups N``) a share of the jobs belongs to N ordered
groups (``ADDJOB ... GROUP key``, docs/EXTENSIONS.md "Ordered groups").
Those are added through ``disque.Client`` with ``route_groups``, as a user
would add them (each at its group's home, the next node by rank while that
one fails): the routing is what is under test.  Each group belongs to one
producer, which waits for each ADDJOB's reply before the next, so the
group's add order is that producer's order of replies (``seq``).  The
client may re-send an ADDJOB whose reply it lost to the next node by rank:
the op is then marked ``resent`` (a job of that body may exist under an ID
never answered).  Consumers then ask GETJOB for ``WITHLEASE`` and
``WITHGROUP``: the lease tells the checker until when the node certainly
had the job out.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque.client import Client, ConnectionFailed, DisqueError
from faults.history import FAIL, INFO, OK, History, Op
from faults.nodes import PORT, Node

QUEUE = "faults-q"
ROLES = ("normal", "slow", "crashy")


@dataclass
class WorkloadConfig:
    producers: int = 3
    consumers: int = 3
    retry_s: int = 3
    add_timeout_ms: int = 2000
    max_jobs: int = 2000
    #: Pause between a producer's operations: two cores run everything.
    produce_interval_s: float = 0.02
    #: REPLICATE of each job, drawn from these.
    replicate: tuple[int, ...] = (2, 3)
    async_fraction: float = 0.2
    #: Jobs with DELAY RETRY and TTL 4 x RETRY + 4 (the checker holds their
    #: timers to their bounds).
    ttl_fraction: float = 0.1
    #: Jobs added with an IDMP key (of their own: keys live and expire).
    idmp_fraction: float = 0.1
    crash_probability: float = 0.3
    nack_probability: float = 0.05
    seed: int = 0
    #: Ordered groups: this many keys (0: no job has a group, as before).
    groups: int = 0
    #: ... and the share of the jobs that go to one of them.
    group_fraction: float = 0.5


def connect(node: Node, timeout: float) -> redis.Redis:
    """A connection that never re-sends a command by itself."""
    return redis.Redis(host=node.ip, port=PORT, protocol=2, socket_timeout=timeout,
                       socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0))


def _decode(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Worker:
    """A process of the history: its name, RNG and one connection per node."""

    def __init__(self, name: str, nodes: Sequence[Node], history: History, seed: int,
                 timeout: float) -> None:
        self.name = name
        self.nodes = list(nodes)
        self.history = history
        self.rng = random.Random(f"{seed}-{name}")
        self.timeout = timeout
        self._conns: dict[str, redis.Redis] = {}

    def conn(self, node: Node) -> redis.Redis:
        if node.name not in self._conns:
            self._conns[node.name] = connect(node, self.timeout)
        return self._conns[node.name]

    def drop(self, node: Node) -> None:
        """Close the connection (after a timeout its state is unknown)."""
        conn = self._conns.pop(node.name, None)
        if conn is not None:
            conn.close()

    def call(self, op: Op, node: Node, *args: object) -> object:
        """Run a command for ``op``; record fail/info and return None on error."""
        try:
            return self.conn(node).execute_command(*args)
        except redis.ResponseError as err:
            self.history.finish(op, FAIL, error=str(err)[:120])
        except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
            self.drop(node)
            self.history.finish(op, INFO, error=f"{type(err).__name__}: {err}"[:120])
        return None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


class Workload:
    """Producers and consumers on random nodes until stopped or out of jobs."""

    def __init__(self, nodes: Sequence[Node], history: History, config: WorkloadConfig) -> None:
        self.nodes = list(nodes)
        self.history = history
        self.config = config
        self.stopping = threading.Event()
        self._produced = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.gc = GcObserver(nodes, history)

    def start(self) -> None:
        c = self.config
        for i in range(c.producers):
            self._spawn(self._produce, f"p{i + 1}")
        for i in range(c.consumers):
            self._spawn(self._consume, f"c{i + 1}", ROLES[i % len(ROLES)])
        self.gc.start()

    def _spawn(self, target, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=str(args[0]), daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Stop producers and consumers (the GC observer goes on: see :meth:`close`)."""
        self.stopping.set()
        for thread in self._threads:
            thread.join(30)

    def close(self) -> None:
        self.stop()
        self.gc.stop()

    def _take_job_number(self) -> int | None:
        with self._lock:
            if self._produced >= self.config.max_jobs:
                return None
            self._produced += 1
            return self._produced

    def _produce(self, name: str) -> None:
        c = self.config
        worker = Worker(name, self.nodes, self.history, c.seed,
                         c.add_timeout_ms / 1000 + 3)
        groups = GroupProducer(self, worker, int(name[1:]) - 1) if c.groups else None
        while not self.stopping.is_set():
            number = self._take_job_number()
            if number is None:
                break
            if groups is not None and groups.keys and worker.rng.random() < c.group_fraction:
                groups.add(f"{name}-{number}")
                self.stopping.wait(c.produce_interval_s)
                continue
            node = worker.rng.choice(self.nodes)
            replicate = worker.rng.choice(c.replicate)
            is_async = worker.rng.random() < c.async_fraction
            body = f"{name}-{number}"
            args: list[object] = ["ADDJOB", QUEUE, body, c.add_timeout_ms,
                                  "REPLICATE", replicate, "RETRY", c.retry_s]
            extra: dict[str, object] = {"replicate": replicate, "async": is_async,
                                        "retry": c.retry_s}
            if is_async:
                args.append("ASYNC")
            if worker.rng.random() < c.ttl_fraction:
                extra.update(delay=c.retry_s, ttl=4 * c.retry_s + 4)
                args += ["DELAY", extra["delay"], "TTL", extra["ttl"]]
            if worker.rng.random() < c.idmp_fraction:
                args += ["IDMP", body]
            op = self.history.begin(name, "add", node.name, body=body, extra=extra)
            reply = worker.call(op, node, *args)
            if reply is not None:
                job_id = _decode(reply)
                self.history.finish(op, OK, job_id=job_id)
                if not is_async:
                    op.extra["copies"] = copy_nodes(worker, node, job_id)
            self.stopping.wait(c.produce_interval_s)
        worker.close()
        if groups is not None:
            groups.close()

    def _consume(self, name: str, role: str) -> None:
        c = self.config
        worker = Worker(name, self.nodes, self.history, c.seed, 3.0)
        while not self.stopping.is_set():
            node = worker.rng.choice(self.nodes)
            jobs = get_jobs(worker, node, timeout_ms=300, phase="run", role=role,
                            groups=c.groups > 0)
            if not jobs:
                continue
            job_id = jobs[0].job_id
            assert job_id is not None
            if role == "crashy" and worker.rng.random() < c.crash_probability:
                # The consumer dies with the job: no ACK; it comes back after RETRY.
                crash = self.history.begin(name, "crash", node.name, job_id=job_id)
                worker.drop(node)
                self.history.finish(crash, OK)
                continue
            if role == "slow":
                self.stopping.wait(worker.rng.uniform(0, 1.5 * c.retry_s))
            if role == "normal" and worker.rng.random() < c.nack_probability:
                op = self.history.begin(name, "nack", node.name, job_id=job_id)
                if worker.call(op, node, "NACK", job_id) is not None:
                    self.history.finish(op, OK)
                continue
            ack_node = node if worker.rng.random() < 0.5 else worker.rng.choice(self.nodes)
            ack_jobs(worker, ack_node, [job_id], self.gc)
        worker.close()


class GroupProducer:
    """A producer's jobs of ordered groups, added through ``disque.Client``.

    Producer ``index`` owns the keys ``g{k}`` with ``k % producers ==
    index``: one producer per group, each ADDJOB sent after the previous
    one's reply, so the group's add order is well defined (``seq``: the
    order of this producer's attempts; the checker orders the jobs whose
    ADDJOB returned an ID by it).  Without the ownership, concurrent
    producers' jobs would join a group in whatever order their replication
    completed (docs/EXTENSIONS.md, "Limits").
    """

    def __init__(self, workload: Workload, worker: Worker, index: int) -> None:
        c = workload.config
        self.workload = workload
        self.worker = worker
        self.keys = [f"g{k}" for k in range(c.groups) if k % c.producers == index]
        self.seq = dict.fromkeys(self.keys, 0)
        # No retries of its own beyond the group routing (which is what is
        # tested): the node that answers is the one the op records.
        self.client = Client([n.address for n in workload.nodes], max_retries=0,
                             socket_timeout=c.add_timeout_ms / 1000 + 3,
                             connect_timeout=1.0, reconnect_timeout=1.0,
                             route_by_job_id=False, rng=random.Random(worker.rng.random()))
        #: Nodes the client gave up on during the current call, for the next
        #: by rank: unreachable, or a reply lost (the ADDJOB may have
        #: happened there too).
        self.gave_up: list[str] = []
        router = self.client._groups
        assert router is not None
        give_up = router.failed

        def failed(node_id: str) -> None:
            self.gave_up.append(node_id)
            give_up(node_id)

        router.failed = failed  # type: ignore[method-assign]

    def add(self, body: str) -> None:
        c = self.workload.config
        key = self.worker.rng.choice(self.keys)
        self.seq[key] += 1
        replicate = self.worker.rng.choice(c.replicate)
        extra: dict[str, object] = {"replicate": replicate, "async": False,
                                    "retry": c.retry_s, "group": key, "seq": self.seq[key],
                                    "client": True}
        history = self.workload.history
        op = history.begin(self.worker.name, "add", "?", body=body, extra=extra)
        self.gave_up.clear()
        try:
            job_id = self.client.add_job(QUEUE, body, timeout_ms=c.add_timeout_ms,
                                         replicate=replicate, retry=c.retry_s, group=key)
        except ConnectionFailed as err:
            history.finish(op, INFO, error=f"ConnectionFailed: {err}"[:120])
        except DisqueError as err:
            history.finish(op, FAIL, error=str(err)[:120])
        except (redis.RedisError, OSError) as err:
            history.finish(op, INFO, error=f"{type(err).__name__}: {err}"[:120])
        else:
            creator = self.creator(job_id)
            op.node = creator.name if creator is not None else job_id[2:10]
            history.finish(op, OK, job_id=job_id)
            op.extra["copies"] = (None if creator is None
                                  else copy_nodes(self.worker, creator, job_id))
        if self.gave_up:
            op.extra["resent"] = [self.node_name_of_id(i) for i in self.gave_up]

    def node_name_of_id(self, node_id: str) -> str:
        return next((n.name for n in self.workload.nodes if n.node_id == node_id), node_id[:8])

    def creator(self, job_id: str) -> Node | None:
        """The node that created a job: its ID carries the node's first 8 hex digits."""
        prefix = job_id[2:10]
        return next((n for n in self.workload.nodes if n.node_id.startswith(prefix)), None)

    def close(self) -> None:
        self.client.close()


def copy_nodes(worker: Worker, node: Node, job_id: str) -> list[str] | None:
    """The nodes holding copies of a job just added (SHOW's nodes-delivered),
    by name; None if ``node`` did not say (the checker then falls back)."""
    try:
        reply = worker.conn(node).execute_command("SHOW", job_id)
    except (redis.RedisError, OSError):
        worker.drop(node)
        return None
    if not reply:
        return None   # already acked and collected, or expired
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    names = {n.node_id: n.name for n in worker.nodes}
    return sorted(names.get(_decode(i), _decode(i)[:8]) for i in fields.get(b"nodes-delivered", []))


def get_jobs(worker: Worker, node: Node, timeout_ms: int | None, phase: str,
             role: str, count: int = 1, groups: bool = False) -> list[Op]:
    """GETJOB from ``node``; records one get op per job delivered (or one empty/failed).

    With ``groups`` it asks for each job's lease and group too (``lease_ms``,
    ``group``).  The jobs of one reply share the op's start and end, and
    ``pos`` is their place in it (a reply may hand out several jobs of one
    group, in order)."""
    wait = ["NOHANG"] if timeout_ms is None else ["TIMEOUT", timeout_ms]
    op = worker.history.begin(worker.name, "get", node.name, extra={"phase": phase,
                                                                    "role": role})
    more = ["WITHLEASE", "WITHGROUP"] if groups else []
    reply = worker.call(op, node, "GETJOB", *wait, "COUNT", count, "WITHCOUNTERS", *more,
                        "FROM", QUEUE)
    if reply is None:
        if op.end == 0.0:  # a nil reply (call() records errors): nothing came
            op.extra["empty"] = True
            worker.history.finish(op, OK)
        return []
    ops = []
    assert isinstance(reply, list), reply
    end = worker.history.now()
    for pos, entry in enumerate(reply):
        fields = dict(zip(entry[3::2], entry[4::2], strict=False))
        extra: dict[str, object] = {
            "phase": phase, "role": role,
            "nacks": int(fields.get(b"nacks", 0)),
            "additional_deliveries": int(fields.get(b"additional-deliveries", 0))}
        if groups:
            lease = fields.get(b"next-requeue-within")
            group = fields.get(b"group")
            extra.update(pos=pos, lease_ms=None if lease is None else int(lease),
                         group=None if group is None else _decode(group))
        got = worker.history.begin(worker.name, "get", node.name, extra=extra)
        got.start = op.start
        worker.history.finish(got, OK, job_id=_decode(entry[1]), body=_decode(entry[2]))
        got.end = end
        ops.append(got)
    return ops


def ack_jobs(worker: Worker, node: Node, job_ids: list[str], gc: GcObserver | None) -> bool:
    """ACKJOB ``job_ids`` on ``node``: one ack op per job, all with the command's outcome."""
    ops = [worker.history.begin(worker.name, "ack", node.name, job_id=j) for j in job_ids]
    reply = worker.call(ops[0], node, "ACKJOB", *job_ids)
    for op in ops[1:]:
        op.end = ops[0].end
        worker.history.finish(op, ops[0].outcome if reply is None else OK,
                              error=ops[0].error)
    if reply is None:
        return False
    worker.history.finish(ops[0], OK)
    if gc is not None:
        gc.watch(job_ids)
    return True


class GcObserver:
    """Records when an acked job is gone from every node (GC completed).

    After an ACK returned, every node is asked ``SHOW id`` until all of them
    answer nil in one round; a node that does not answer (down, paused,
    unreachable) leaves the job pending.  The recorded time is an upper
    bound of the moment the cluster forgot the job.
    """

    def __init__(self, nodes: Sequence[Node], history: History) -> None:
        self.worker = Worker("gc", nodes, history, 0, 0.5)
        self.history = history
        self.pending: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)
        self.worker.close()

    def watch(self, job_ids: list[str]) -> None:
        now = self.history.now()
        with self._lock:
            for job_id in job_ids:
                self.pending.setdefault(job_id, now)

    def _run(self) -> None:
        while not self._stopping.wait(0.25):
            with self._lock:
                batch = list(self.pending.items())[:300]
            if not batch:
                continue
            start = self.history.now()
            gone = [job_id for job_id, _ in batch]
            for node in self.worker.nodes:
                if not gone:
                    break
                try:
                    pipe = self.worker.conn(node).pipeline(transaction=False)
                    for job_id in gone:
                        pipe.execute_command("SHOW", job_id)
                    replies = pipe.execute()
                except (redis.RedisError, OSError):
                    self.worker.drop(node)
                    gone = []
                    break
                gone = [j for j, r in zip(gone, replies, strict=True) if r is None]
            with self._lock:
                for job_id in gone:
                    self.pending.pop(job_id, None)
            for job_id in gone:
                op = Op("gc", "gc", "*", start, job_id=job_id)
                self.history.finish(op, OK)
