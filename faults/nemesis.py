"""The nemesis: applies faults, alone or overlapping, and heals them.

Every fault kind has a *start* that breaks something and returns an
:class:`Active` fault (its history record, what it holds, how to heal it,
how to see that it bit).  A schedule of one kind applies it again and
again: each cycle starts a fault, holds it long enough for the nodes to
notice (more than the node timeout), heals it and lets the cluster recover.
The ``mixed`` schedule draws faults of every kind at random times, several
at once (a partition while a node is paused, a kill during lossy links, a
clock jump while a disk is full...), from a seeded generator; ``soak`` draws
one fault of any kind at a time with a quiet minute after each, for long
runs that watch memory from heal to heal.

What a fault visibly did (a node flagged ``fail?``, packets dropped, bytes
delayed, a node's clock off, a node's AOF refusing writes) is written into
its ``effects``: a schedule whose faults had no effect proves nothing, and
the tests check for them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations, permutations

import redis

from faults.history import Fault, History
from faults.nft import Drop, Firewall, Redirect, Rule
from faults.nodes import BUS_PORT, Cluster, Node
from faults.relay import DelayRelay

#: Schedules of one kind each.
SINGLE_KINDS = ("partition", "pause", "kill", "lossy", "slow", "clock", "disk")
#: Every schedule: the single kinds, the mixes, and ``none`` (the workload
#: alone: what holds without a fault).
KINDS = (*SINGLE_KINDS, "mixed", "soak", "none")
#: soak: the quiet time after each fault (less in runs shorter than 4 minutes).
SOAK_QUIET_S = 60.0
#: Faults on the network between nodes: one at a time (their rules would mix).
NETWORK = frozenset(("partition", "lossy", "slow"))
#: Faults that stop a node's process.
PROCESS = frozenset(("pause", "kill"))


def needs(kinds: list[str]) -> tuple[bool, bool]:
    """Whether schedules ``kinds`` need (small disks, libfaketime)."""
    mixes = {"mixed", "soak"} & set(kinds)
    return bool(mixes or "disk" in kinds), bool(mixes or "clock" in kinds)


@dataclass
class Active:
    """A fault in force."""

    fault: Fault
    kind: str
    #: Nodes it acts on (a process, clock or disk fault's victim).
    victims: set[str]
    heal: Callable[[], None]
    #: Polled while the fault lasts until it reports an effect.
    seen: Callable[[], str | None] | None = None
    #: When the mixed schedule heals it (monotonic seconds).
    until: float = 0.0
    effects_at_heal: list[Callable[[], str | None]] = field(default_factory=list)


class Nemesis:
    def __init__(self, cluster: Cluster, history: History, firewall: Firewall,
                 relay: DelayRelay, seed: int, node_timeout_ms: int,
                 slow_delay_s: float = 0.4, loss_percent: int = 30,
                 clock_jump_s: tuple[int, int] = (20, 90)) -> None:
        self.cluster = cluster
        self.nodes = cluster.nodes
        self.history = history
        self.firewall = firewall
        self.relay = relay
        self.rng = random.Random(f"{seed}-nemesis")
        self.timeout_s = node_timeout_ms / 1000
        self.slow_delay_s = slow_delay_s
        self.loss_percent = loss_percent
        self.clock_jump_s = clock_jump_s
        self.active: list[Active] = []
        #: What went wrong healing (a node that refused to start again): defects.
        self.errors: list[str] = []
        #: Called after each heal once the cluster is healthy again (memory samples).
        self.after_heal: Callable[[], None] | None = None
        self._cycle = 0
        self._serial = 0

    # -- schedules ------------------------------------------------------------

    def run(self, kind: str, duration_s: float) -> None:
        """Faults of ``kind`` until ``duration_s`` from now (the last one completes)."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
        deadline = time.monotonic() + duration_s
        if kind == "none":
            self._hold(duration_s)
            return
        # A first quiet moment: the history starts with a healthy cluster.
        self._hold(min(1.0, duration_s / 4))
        if kind == "mixed":
            self._mixed(deadline)
            return
        while time.monotonic() < deadline:
            if kind == "soak":
                # One fault at a time, of any kind, then a quiet minute.
                kinds = [k for k in SINGLE_KINDS if self._can_start(k)]
                active = self.start(self.rng.choice(kinds))
            else:
                active = self.start(kind)
            if active is None:
                raise RuntimeError(f"no node can take a {kind} fault")
            self._watch([active], time.monotonic() + self._fault_hold())
            self._stop(active)
            self._cycle += 1
            self._recover(deadline)
            if kind == "soak":
                quiet = min(SOAK_QUIET_S, duration_s / 4)
                self._hold(min(quiet, max(0.0, deadline - time.monotonic())))

    def _mixed(self, deadline: float) -> None:
        """Faults of every kind at random moments, overlapping, until ``deadline``.

        A new fault every 0.5-2.5 s while fewer than three are active; one
        on the network at a time, one per node, and never so many nodes
        stopped that no majority is left.  Each lasts a random time past the
        node timeout.
        """
        next_start = time.monotonic()
        while time.monotonic() < deadline or self.active:
            now = time.monotonic()
            for ended in [a for a in self.active if a.until <= now]:
                self._stop(ended)
            if now >= next_start and now < deadline and len(self.active) < 3:
                kinds = [k for k in SINGLE_KINDS if self._can_start(k)]
                started = self.start(self.rng.choice(kinds)) if kinds else None
                if started is not None:
                    started.until = now + self._fault_hold() * self.rng.uniform(0.7, 1.6)
                    self._cycle += 1
                next_start = now + self.rng.uniform(0.5, 2.5)
            self._poll_effects()
            time.sleep(0.1)
        self._recover(deadline + 3 * self.timeout_s + 5)

    def _can_start(self, kind: str) -> bool:
        kinds = {a.kind for a in self.active}
        if kind in NETWORK:
            return not kinds & NETWORK
        if kind in PROCESS:
            stopped = sum(1 for a in self.active if a.kind in PROCESS)
            most_stopped = (len(self.nodes) - 1) // 2
            return stopped < most_stopped and bool(self._free_nodes())
        if kind == "clock":
            return "clock" not in kinds and self.nodes[0].clock_file is not None
        if kind == "disk":
            return "disk" not in kinds and bool(
                [n for n in self._free_nodes() if n.disk is not None])
        return False

    def _free_nodes(self) -> list[Node]:
        """Nodes no fault holds: the victims of the next process, clock or disk fault."""
        held = {name for a in self.active for name in a.victims}
        return [n for n in self.nodes if n.name not in held]

    # -- holding, watching, recovering -----------------------------------------

    def _hold(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _recover(self, deadline: float) -> None:
        """Let the cluster heal (at most until ``deadline``), then a quiet second."""
        end = min(deadline, time.monotonic() + 3 * self.timeout_s + 5)
        while time.monotonic() < end and not self.cluster.healthy():
            time.sleep(0.1)
        if self.after_heal is not None and self.cluster.healthy():
            self.after_heal()
        self._hold(min(1.0, max(0.0, deadline - time.monotonic())))

    def _fault_hold(self) -> float:
        """How long a fault lasts: past the node timeout, so failures are detected."""
        return self.timeout_s * 2 + self.rng.uniform(0.5, 1.5)

    def _watch(self, actives: list[Active], until: float) -> None:
        """Poll the faults' effect checks until ``until``."""
        while time.monotonic() < until:
            self._poll_effects(actives)
            time.sleep(0.1)

    def _poll_effects(self, actives: list[Active] | None = None) -> None:
        for active in actives if actives is not None else self.active:
            if active.seen is None:
                continue
            effect = _quiet(active.seen)
            if effect:
                active.fault.effects.append(f"{self.history.now():.1f}s: {effect}")
                active.seen = None

    def _stop(self, active: Active) -> None:
        for effect in active.effects_at_heal:
            text = _quiet(effect)
            if text:
                active.fault.effects.append(text)
        try:
            active.heal()
        except RuntimeError as err:   # a node that does not start again
            active.fault.effects.append(f"heal failed: {err}")
            self.errors.append(f"{active.fault.description}: heal failed: {err}")
        active.fault.end = self.history.now()
        if active in self.active:
            self.active.remove(active)

    def heal_all(self) -> None:
        """Undo everything: rules, relays, pauses, clocks, disks, dead nodes."""
        for active in list(self.active):
            self._stop(active)
        self.firewall.heal()
        self.relay.clear()
        for node in self.nodes:
            node.resume()
            if node.clock_file is not None:
                node.set_clock_offset(0)
            if node.disk is not None:
                node.disk.heal()
            if not node.alive():
                try:
                    node.start()
                except RuntimeError as err:
                    self.errors.append(f"{node.name} does not start again: {err}")

    # -- starting faults --------------------------------------------------------

    def start(self, kind: str) -> Active | None:
        """Start a fault of ``kind`` (None: no node can take it now)."""
        active = getattr(self, f"_start_{kind}")()
        if active is not None:
            self.active.append(active)
        return active

    def _record(self, kind: str, description: str, nodes: list[Node]) -> Fault:
        self._serial += 1
        return self.history.fault(kind, description, [n.name for n in nodes])

    def _tag(self) -> str:
        return f"f{self._serial}"

    def _flagged(self, victims: list[Node], observers: list[Node]) -> Callable[[], str | None]:
        """An effect check: some observer flags some victim as failing."""
        def seen() -> str | None:
            for observer in observers:
                if not observer.alive() or observer.paused:
                    continue
                for victim in victims:
                    flags = self.cluster.flags(observer, victim)
                    if flags & {"fail?", "fail"}:
                        return (f"{observer.name} flags {victim.name} "
                                f"{','.join(sorted(flags & {'fail?', 'fail'}))}")
            return None
        return seen

    def _rules_fault(self, kind: str, text: str, rules: list[Rule],
                     seen: Callable[[], str | None] | None) -> Active:
        fault = self._record(kind, text, list(self.nodes))
        tag = self._tag()
        self.firewall.set(tag, rules)

        def dropped() -> str | None:
            packets = self.firewall.dropped_packets(tag)
            return f"{packets} packets dropped" if packets else None

        return Active(fault, kind, set(), lambda: self.firewall.clear(tag), seen,
                      effects_at_heal=[dropped])

    def _start_partition(self) -> Active:
        nodes = list(self.nodes)
        self.rng.shuffle(nodes)
        pattern = ("majority", "bridge", "one-way")[self._cycle % 3]
        if pattern == "majority":
            minority, majority = nodes[: (len(nodes) - 1) // 2], nodes[(len(nodes) - 1) // 2:]
            cut = [(a, b) for a in minority for b in majority]
            rules: list[Rule] = [Drop(a.ip, b.ip) for x, y in cut for a, b in ((x, y), (y, x))]
            text = f"{_names(minority)} | {_names(majority)}"
            victims, observers = minority, majority
        elif pattern == "bridge":
            # The first node sees everyone; the two halves of the others do not
            # see each other.
            bridge, rest = nodes[0], nodes[1:]
            left, right = rest[: len(rest) // 2], rest[len(rest) // 2:]
            rules = [Drop(a.ip, b.ip) for x in left for y in right
                     for a, b in ((x, y), (y, x))]
            text = f"{_names(left)} | {_names(right)}, bridged by {bridge.name}"
            victims, observers = left, right
        else:
            src, dst = nodes[0], nodes[1]
            rules = [Drop(src.ip, dst.ip)]
            text = f"{src.name} -> {dst.name} dropped (one way)"
            victims, observers = [src], [dst]
        return self._rules_fault("partition", f"{pattern}: {text}", rules,
                                 self._flagged(victims, observers))

    def _start_lossy(self) -> Active:
        rules: list[Rule] = [Drop(a.ip, b.ip, self.loss_percent)
                             for a, b in permutations(self.nodes, 2)]
        return self._rules_fault("lossy", f"{self.loss_percent}% loss between all nodes",
                                 rules, None)

    def _start_slow(self) -> Active:
        victim = self.rng.choice(self.nodes)
        fault = self._record("slow", f"{victim.name}'s bus links delayed "
                             f"{self.slow_delay_s * 1000:.0f} ms each way", [victim])
        tag = self._tag()
        rules: list[Rule] = []
        ports = []
        for a, b in combinations(self.nodes, 2):
            if victim not in (a, b):
                continue
            for src, dst in ((a, b), (b, a)):
                port = self.relay.add(dst.ip, BUS_PORT, self.slow_delay_s)
                ports.append(port)
                rules.append(Redirect(src.ip, dst.ip, BUS_PORT, port))
        before = self.relay.forwarded
        self.firewall.set(tag, rules)

        def relayed() -> str | None:
            late = self.relay.forwarded - before
            return (f"{late} bytes relayed late, {self.firewall.dropped_packets(tag)} "
                    f"direct packets reset") if late else None

        def heal() -> None:
            self.firewall.clear(tag)
            self.relay.remove(ports)

        return Active(fault, "slow", set(), heal, None, effects_at_heal=[relayed])

    def _start_pause(self) -> Active | None:
        free = [n for n in self._free_nodes() if n.alive()]
        if not free:
            return None
        victim = self.rng.choice(free)
        fault = self._record("pause", f"SIGSTOP {victim.name}", [victim])
        victim.pause()
        others = [n for n in self.nodes if n is not victim]
        return Active(fault, "pause", {victim.name}, victim.resume,
                      self._flagged([victim], others))

    def _start_kill(self) -> Active | None:
        free = [n for n in self._free_nodes() if n.alive()]
        if not free:
            return None
        victim = self.rng.choice(free)
        persistence = "AOF fsync always" if victim.aof else "no AOF: its jobs are lost"
        fault = self._record("kill", f"SIGKILL {victim.name} ({persistence})", [victim])
        fault.lost_for_good = not victim.aof
        victim.kill()
        others = [n for n in self.nodes if n is not victim]
        return Active(fault, "kill", {victim.name}, victim.start,
                      self._flagged([victim], others))

    def _start_clock(self) -> Active | None:
        free = [n for n in self._free_nodes() if n.clock_file is not None and n.alive()]
        if not free:
            return None
        victim = self.rng.choice(free)
        low, high = self.clock_jump_s
        jump = self.rng.randint(low, high) * (1 if self._cycle % 2 == 0 else -1)
        fault = self._record("clock", f"{victim.name}'s wall clock jumps {jump:+d} s "
                             f"(and back at the heal)", [victim])
        victim.set_clock_offset(jump)

        def seen() -> str | None:
            if victim.paused or not victim.alive():
                return None
            off = victim.wall_clock() - time.time()
            if abs(off - jump) < max(5.0, abs(jump) / 4):
                return f"{victim.name}'s TIME is {off:+.0f} s off"
            return None

        return Active(fault, "clock", {victim.name}, lambda: victim.set_clock_offset(0),
                      seen)

    def _start_disk(self) -> Active | None:
        free = [n for n in self._free_nodes() if n.disk is not None and n.alive()]
        if not free:
            return None
        victim = self.rng.choice(free)
        disk = victim.disk
        assert disk is not None
        full = self._cycle % 2 == 0
        if full:
            fault = self._record("disk", f"{victim.name}'s disk full (ENOSPC)", [victim])
            disk.fill()
        else:
            fault = self._record("disk", f"{victim.name}'s disk fails its writes (fsync error)",
                                 [victim])
            disk.break_device()

        def seen() -> str | None:
            if victim.paused or not victim.alive():
                return None
            info = victim.client().info("persistence")
            if info.get("aof_last_write_status") == "err":
                return f"{victim.name} refuses writes: {info.get('aof_last_write_error')}"
            return None

        return Active(fault, "disk", {victim.name}, disk.heal, seen)


def _names(nodes: list[Node]) -> str:
    return ",".join(n.name for n in nodes)


def _quiet(check: Callable[[], str | None]) -> str | None:
    """``check()``, with a node that does not answer counting as no effect yet."""
    try:
        return check()
    except (redis.RedisError, OSError):
        return None
