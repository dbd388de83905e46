"""What a user may do from the console, each an audited command on the nodes.

Every action runs as the session's user, so the nodes decide (a ``-NOPERM``
comes back as such), and writes one audit line whatever its outcome:
``user=... action=... target=... result=...``.  Actions on a queue go to
every node (each node has its own pause state and rate limit) and report
each node's answer; actions on a job go to the nodes holding a copy (found
with SHOW), the job's creator first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from disque.client import AsyncClient

from .audit import audit_log
from .nodes import Answer, Node, Pool
from .queries import JOB_ID, LookupProblem
from .shows import show_one

__all__ = ["Outcome", "Actions", "JOB_ACTIONS", "PAUSE_STATES", "DESTRUCTIVE", "audit_log"]


JOB_ACTIONS = ("ack", "nack", "working", "enqueue", "dequeue", "deljob")
PAUSE_STATES = ("none", "in", "out", "all")
#: Actions that need an explicit confirmation (they lose or hold back work).
DESTRUCTIVE = {"ack", "deljob", "dequeue", "pause", "leaving"}


@dataclass
class Outcome:
    """What one action did: per node, ``ok`` or the node's answer."""

    action: str
    target: str
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r["ok"] for r in self.results)

    @property
    def summary(self) -> str:
        if not self.results:
            return f"{self.action} {self.target}: no node to act on"
        if self.ok:
            values = {str(r["value"]) for r in self.results}
            return f"{self.action} {self.target}: done ({', '.join(sorted(values))})"
        failed = [f"{r['node']}: {r['message']}" for r in self.results if not r["ok"]]
        return f"{self.action} {self.target}: " + "; ".join(failed)

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "target": self.target, "ok": self.ok,
                "summary": self.summary, "results": self.results}


def _record(outcome: Outcome, answers: list[Answer[Any]]) -> None:
    for answer in answers:
        if answer.problem is None:
            value = answer.value
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            outcome.results.append({"node": answer.node.address, "ok": True, "value": value})
        else:
            outcome.results.append({"node": answer.node.address, "ok": False,
                                    "kind": answer.problem.kind,
                                    "message": answer.problem.message})


class Actions:
    """The actions of one session: its user and pool."""

    def __init__(self, user: str, pool: Pool) -> None:
        self.user = user
        self.pool = pool

    def _audit(self, outcome: Outcome, detail: str = "") -> Outcome:
        result = "ok" if outcome.ok else "failed"
        problems = ",".join(sorted({r.get("kind", "") for r in outcome.results if not r["ok"]}))
        audit_log.info("user=%s action=%s target=%s%s result=%s%s", self.user,
                       outcome.action, outcome.target, f" {detail}" if detail else "", result,
                       f" ({problems})" if problems else "")
        return outcome

    # ------------------------------------------------------------- queues

    async def pause(self, queue: str, state: str) -> Outcome:
        """PAUSE on every node: ``none``, ``in``, ``out`` or ``all``."""
        if state not in PAUSE_STATES:
            raise LookupProblem(f"pause state must be one of {', '.join(PAUSE_STATES)}")
        outcome = Outcome("pause", f"queue:{queue}")
        _record(outcome, await self.pool.each(lambda c: c.pause(queue, state)))
        return self._audit(outcome, f"state={state}")

    async def qlimit(self, queue: str, max_jobs: int | None, period_ms: int | None) -> Outcome:
        """QLIMIT on every node that has it (``max_jobs`` None: off)."""
        outcome = Outcome("qlimit", f"queue:{queue}")
        nodes = [n for n in await self.pool.nodes()
                 if self.pool.extensions.get(n.address) is not False]
        if max_jobs is None:
            answers = await self.pool.each(lambda c: c.qlimit(queue, off=True), nodes)
            detail = "off"
        else:
            if not (1 <= max_jobs <= 4294967295 and period_ms is not None
                    and 1 <= period_ms <= 86400000):
                raise LookupProblem("a rate limit is 1 to 4294967295 jobs per 1 to 86400000 ms")
            answers = await self.pool.each(
                lambda c: c.qlimit(queue, max_jobs, period_ms), nodes)
            detail = f"max={max_jobs} period_ms={period_ms}"
        _record(outcome, answers)
        for answer in answers:  # an original node: remembered, and not an error
            if answer.problem is not None and answer.problem.kind == "unsupported":
                self.pool.extensions[answer.node.address] = False
        outcome.results = [r for r in outcome.results if r.get("kind") != "unsupported"]
        return self._audit(outcome, detail)

    # --------------------------------------------------------------- jobs

    async def _holders(self, job_id: str) -> list[Node]:
        """The nodes holding a copy of the job, its creator first."""
        if not JOB_ID.fullmatch(job_id):
            raise LookupProblem(f"{job_id[:80]!r} is not a job ID")
        nodes = await self.pool.nodes()
        answers = await asyncio.gather(*(self.pool.on(n, show_one(self.pool, n, job_id))
                                         for n in nodes))
        holders = [a.node for a in answers if a.problem is None and a.value is not None]
        creator = job_id[2:10]
        holders.sort(key=lambda n: not (n.id or "").startswith(creator))
        refusals = [a for a in answers if a.problem is not None and a.problem.kind == "noperm"]
        if not holders and refusals:
            # Not knowing whether the job exists is the node's answer to give.
            return [refusals[0].node]
        return holders

    async def job(self, action: str, job_id: str, delay: int | None = None) -> Outcome:
        """``ack``, ``nack`` (``delay`` seconds, an extension), ``working``,
        ``enqueue``, ``dequeue`` or ``deljob`` one job."""
        if action not in JOB_ACTIONS:
            raise LookupProblem(f"unknown job action {action[:20]!r}")
        if delay is not None and not 0 <= delay <= 315360000:
            raise LookupProblem("a NACK delay is 0 to 315360000 seconds")
        outcome = Outcome(action, f"job:{job_id}")
        holders = await self._holders(job_id)
        if not holders:
            outcome.results.append({"node": "-", "ok": False, "kind": "nojob",
                                    "message": "no node knows this job"})
            return self._audit(outcome)
        calls: dict[str, Callable[[AsyncClient], Awaitable[Any]]] = {
            "ack": lambda c: c.ack(job_id),
            "nack": lambda c: c.nack(job_id, delay=delay or None),
            "working": lambda c: c.working(job_id),
            "enqueue": lambda c: c.enqueue(job_id),
            "dequeue": lambda c: c.dequeue(job_id),
            "deljob": lambda c: c.del_job(job_id),
        }
        # ACK, NACK, WORKING and ENQUEUE act cluster-wide from one copy (the
        # node tells the others); DEQUEUE and DELJOB act on one node's copy only.
        targets = holders if action in ("dequeue", "deljob") else holders[:1]
        _record(outcome, await self.pool.each(calls[action], targets))
        return self._audit(outcome, f"delay={delay}" if action == "nack" and delay else "")

    # -------------------------------------------------------------- nodes

    async def leaving(self, address: str, leaving: bool) -> Outcome:
        """CLUSTER LEAVING yes|no on one node."""
        nodes = {n.address: n for n in await self.pool.nodes()}
        node = nodes.get(address)
        if node is None:
            raise LookupProblem(f"{address[:80]!r} is not a node of this cluster")
        outcome = Outcome("leaving", f"node:{address}")
        _record(outcome, [await self.pool.on(node, lambda c: c.cluster_leaving(leaving))])
        return self._audit(outcome, "yes" if leaving else "no")
