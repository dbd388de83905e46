"""One fault schedule, end to end: cluster, workload + nemesis, heal, settle, drain, check.

Phases (marked in the history): ``workload`` (producers, consumers and the
nemesis run), ``healed`` (every fault undone, dead nodes restarted),
``stopped`` (clients stopped), ``settled`` (no job queued on two nodes),
``drained`` (every job delivered and acked, the nodes empty).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from faults.checker import FinalState, Result, check
from faults.history import History
from faults.nemesis import Nemesis, needs
from faults.nft import Firewall
from faults.nodes import Cluster, Node
from faults.relay import DelayRelay
from faults.workload import QUEUE, ROLES, Worker, Workload, WorkloadConfig, ack_jobs, get_jobs

#: Directives of every node: the AOF is rewritten often (a rewrite is also
#: how a node recovers from an fsync error), so a small disk never fills up
#: by itself.
NODE_ARGS = ["--auto-aof-rewrite-min-size", "4mb"]


@dataclass
class Schedule:
    kind: str
    seconds: float
    nodes: int = 3
    node_timeout_ms: int = 2000
    #: Which nodes have AOF (appendfsync always); the others lose their jobs on SIGKILL.
    aof: list[bool] = field(default_factory=lambda: [True, True, False])
    drain_timeout_s: float = 60.0
    #: After the drain, how long the ACK GC may take.  Every acked copy
    #: retries it with a backoff (1, 2, 4 ... s, capped at 180 s) that grows
    #: while a node is away: after two minutes of faults the next attempt can
    #: be minutes off, so the wait covers the cap (it ends as soon as the
    #: nodes are empty: 52 s after a 120 s pause schedule).
    gc_timeout_s: float = 200.0
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    #: The wall-clock jumps of the clock faults, in seconds (either way).
    clock_jump_s: tuple[int, int] = (20, 90)
    #: Fault kinds this machine cannot apply, with why (``disk``, ``clock``):
    #: a mixed schedule draws the others.
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    schedule: Schedule
    history: History
    final: FinalState
    result: Result
    notes: list[str] = field(default_factory=list)


def run_schedule(schedule: Schedule, workdir: Path, log=print) -> Outcome:
    aof = (schedule.aof * schedule.nodes)[: schedule.nodes]
    disks, faketime = needs([schedule.kind])
    disks = disks and "disk" not in schedule.unavailable
    faketime = faketime and "clock" not in schedule.unavailable
    history = History()
    final = FinalState()
    cluster = Cluster(workdir, schedule.nodes, schedule.node_timeout_ms, aof, disks=disks,
                      faketime=faketime, extra_args=NODE_ARGS)
    firewall = Firewall()
    relay = DelayRelay()
    notes: list[str] = []
    workload: Workload | None = None
    try:
        cluster.start()
        log(f"[{schedule.kind}] cluster of {schedule.nodes} up "
            f"({', '.join(n.address for n in cluster.nodes)})")
        nemesis = Nemesis(cluster, history, firewall, relay, schedule.workload.seed,
                          schedule.node_timeout_ms, clock_jump_s=schedule.clock_jump_s)
        final.memory.append(memory_sample(cluster.nodes, history, "start"))
        nemesis.after_heal = lambda: final.memory.append(
            memory_sample(cluster.nodes, history, "healed"))
        workload = Workload(cluster.nodes, history, schedule.workload)
        history.mark("workload")
        workload.start()
        nemesis.run(schedule.kind, schedule.seconds)
        nemesis.heal_all()
        final.errors = list(nemesis.errors)
        # A node that did not start again is a defect (in the report); the
        # rest of the run goes on with the others.
        nodes = [n for n in cluster.nodes if n.alive()]
        history.mark("healed")
        workload.stop()
        history.mark("stopped")
        log(f"[{schedule.kind}] {len(history.faults)} faults; healed, clients stopped")
        try:
            cluster.wait_healthy(30 + 3 * schedule.node_timeout_ms / 1000)
        except TimeoutError:
            notes.append("the cluster was not a healthy full mesh 30 s after healing")
        final.queued_twice, final.settle_s = _settle(nodes, 2 * schedule.workload.retry_s + 2)
        final.queued_twice_shown = {job_id: _shown(nodes, job_id)
                                    for job_id in list(final.queued_twice)[:5]}
        history.mark("settled")
        drained = _drain(nodes, history, workload, schedule.drain_timeout_s)
        history.mark("drained")
        if not drained:
            notes.append(f"not drained within {schedule.drain_timeout_s} s")
        if not _wait_gc(nodes, schedule.gc_timeout_s):
            notes.append(f"acked jobs still on nodes {schedule.gc_timeout_s} s after the drain")
        history.mark("collected")
        final.memory.append(memory_sample(nodes, history, "collected"))
        final.registered_jobs, final.jobs = _final_jobs(nodes)
        workload.close()
        workload = None
        return Outcome(schedule, history, final, check(history, final), notes)
    finally:
        if workload is not None:
            workload.close()
        cluster.stop()
        relay.close()
        firewall.close()


def memory_sample(nodes: list[Node], history: History, phase: str) -> dict[str, Any]:
    """Each node's RSS and what INFO says it holds (jobs, IDMP keys, queues,
    link buffers): flat from heal to heal means nothing leaks."""
    sample: dict[str, Any] = {"t": round(history.now(), 1), "phase": phase}
    for node in nodes:
        try:
            info = node.info()
        except (redis.RedisError, OSError):
            continue
        sample[node.name] = {"rss": node.rss_bytes(),
                             **{k: int(info.get(k, 0)) for k in MEMORY_FIELDS}}
    return sample


MEMORY_FIELDS = ("used_memory", "registered_jobs", "idmp_keys", "registered_queues",
                 "mem_cluster_links")


def _queued(nodes: list[Node]) -> dict[str, list[str]]:
    """Job ID -> nodes where it is queued now."""
    where: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        for job_id, state in _scan(node):
            if state == "queued":
                where[job_id].append(node.name)
    return where


def _settle(nodes: list[Node], timeout: float) -> tuple[dict[str, list[str]], float | None]:
    """Wait for no job to be queued on two nodes; what is left at the deadline."""
    start = time.monotonic()
    while True:
        twice = {j: ns for j, ns in _queued(nodes).items() if len(ns) > 1}
        if not twice:
            return {}, time.monotonic() - start
        if time.monotonic() - start > timeout:
            return twice, None
        time.sleep(0.2)


def _shown(nodes: list[Node], job_id: str) -> dict[str, str]:
    """What each node says of a job (SHOW), shortly: its state, node list
    (by name), group and next requeue; "-" where it has none."""
    short = {n.node_id: n.name for n in nodes}
    shown = {}
    for node in nodes:
        try:
            reply = node.client().execute_command("SHOW", job_id)
        except redis.RedisError as err:
            shown[node.name] = f"error: {err}"
            continue
        if not reply:
            shown[node.name] = "-"
            continue
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        holders = ",".join(short.get(i.decode(), i.decode()[:8])
                           for i in fields.get(b"nodes-delivered", []))
        group = fields.get(b"group")
        shown[node.name] = (f"{fields[b'state'].decode()} nodes={holders} group="
                            f"{group.decode() if group else '-'} next-requeue-within="
                            f"{fields.get(b'next-requeue-within')}")
    return shown


def _scan(node: Node) -> list[tuple[str, str]]:
    """Every job on ``node`` with its state (JSCAN, all slices)."""
    jobs = []
    cursor = b"0"
    while True:
        cursor, entries = node.client().execute_command("JSCAN", cursor, "COUNT", 1000,
                                                        "REPLY", "all")
        for entry in entries:
            fields = dict(zip(entry[::2], entry[1::2], strict=True))
            jobs.append((fields[b"id"].decode(), fields[b"state"].decode()))
        if cursor in (b"0", 0, "0"):
            return jobs


def _drain(nodes: list[Node], history: History, workload: Workload, timeout: float) -> bool:
    """Consume and ack everything, on every node, until the nodes are empty."""
    worker = Worker("drain", nodes, history, 0, 3.0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            took = 0
            for node in nodes:
                jobs = get_jobs(worker, node, None, "drain", ROLES[0], count=100,
                                groups=workload.config.groups > 0)
                if jobs:
                    ack_jobs(worker, node, [j.job_id for j in jobs if j.job_id],
                             workload.gc)
                    took += len(jobs)
            if took == 0:
                try:
                    # Only acked copies left: the rest is the GC's business.
                    if all(state == "acked" for n in nodes for _, state in _scan(n)):
                        return True
                except redis.RedisError:
                    pass
                time.sleep(0.2)
        return False
    finally:
        worker.close()


def _wait_gc(nodes: list[Node], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(int(n.info().get("registered_jobs", 1)) == 0 for n in nodes):
                return True
        except redis.RedisError:
            pass
        time.sleep(0.2)
    return False


def _final_jobs(nodes: list[Node]) -> tuple[dict[str, int], dict[str, list[tuple[str, str]]]]:
    """registered_jobs and the jobs left on each node, with what SHOW says of them."""
    registered = {n.name: int(n.info().get("registered_jobs", -1)) for n in nodes}
    short = {n.node_id: n.name for n in nodes}
    left: dict[str, list[tuple[str, str]]] = {}
    for node in nodes:
        left[node.name] = []
        for job_id, state in _scan(node):
            show = node.client().execute_command("SHOW", job_id) or []
            fields = dict(zip(show[::2], show[1::2], strict=True))
            holders = [short.get(i.decode(), i.decode()[:8])
                       for i in fields.get(b"nodes-delivered", [])]
            confirmed = [short.get(i.decode(), i.decode()[:8])
                         for i in fields.get(b"nodes-confirmed", [])]
            left[node.name].append((job_id, f"{state} delivered={','.join(holders)} "
                                            f"confirmed={','.join(confirmed)} next-awake="
                                            f"{fields.get(b'next-awake-within')}"))
    return registered, left


__all__ = ["QUEUE", "Outcome", "Schedule", "run_schedule"]
