"""The history: every client operation and every fault, with their times.

Times are seconds since the start of the run (``time.monotonic()`` based),
so one clock orders client operations and faults.  An operation's outcome is
``ok`` (the node answered with success), ``fail`` (it answered with an
error: the operation certainly did not happen... or, for ADDJOB's -NOREPL,
did not complete) or ``info`` (no answer: a timeout or a lost connection,
so it may or may not have happened), as in Jepsen.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, FAIL, INFO = "ok", "fail", "info"


@dataclass
class Op:
    """One client operation (kinds: add, get, ack, nack, gc)."""

    process: str
    kind: str
    node: str
    start: float
    end: float = 0.0
    outcome: str = INFO
    job_id: str | None = None
    body: str | None = None
    error: str | None = None
    #: add: replicate, async, retry; get: nacks, additional_deliveries, phase.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Fault:
    """A fault's active interval (``end`` is filled when it heals)."""

    kind: str
    description: str
    nodes: list[str]
    start: float
    end: float | None = None
    #: What the harness saw the fault do (e.g. "n1 flagged fail? by n2").
    effects: list[str] = field(default_factory=list)
    #: The nodes' copies did not survive it (SIGKILL of a node without AOF).
    lost_for_good: bool = False


class History:
    """Thread-safe, append-only record of one run."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.ops: list[Op] = []
        self.faults: list[Fault] = []
        self.marks: dict[str, float] = {}
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def begin(self, process: str, kind: str, node: str, **fields: Any) -> Op:
        return Op(process, kind, node, self.now(), **fields)

    def finish(self, op: Op, outcome: str, **fields: Any) -> Op:
        op.end = self.now()
        op.outcome = outcome
        for key, value in fields.items():
            setattr(op, key, value)
        with self._lock:
            self.ops.append(op)
        return op

    def fault(self, kind: str, description: str, nodes: list[str]) -> Fault:
        fault = Fault(kind, description, nodes, self.now())
        with self._lock:
            self.faults.append(fault)
        return fault

    def mark(self, name: str) -> None:
        """A phase boundary (workload start, heal, drain...)."""
        self.marks[name] = self.now()

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"ops": [asdict(o) for o in self.ops],
                    "faults": [asdict(f) for f in self.faults], "marks": dict(self.marks)}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        history = cls()
        history.ops = [Op(**o) for o in data["ops"]]
        history.faults = [Fault(**f) for f in data["faults"]]
        history.marks = dict(data["marks"])
        return history

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_json(json.loads(path.read_text()))
