"""The nemesis: applies one kind of fault again and again, and heals.

Each cycle applies a fault, holds it long enough for the nodes to notice
(more than the node timeout), heals it, and lets the cluster recover before
the next one.  What the fault visibly did (a node flagged ``fail?``, packets
dropped, bytes delayed) is written into the fault's ``effects``: a schedule
whose faults had no effect proves nothing, and the tests check for them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from itertools import combinations, permutations

import redis

from faults.history import Fault, History
from faults.nft import Drop, Firewall, Redirect
from faults.nodes import BUS_PORT, Cluster, Node
from faults.relay import DelayRelay

KINDS = ("partition", "pause", "kill", "lossy", "slow")


class Nemesis:
    def __init__(self, cluster: Cluster, history: History, firewall: Firewall,
                 relay: DelayRelay, seed: int, node_timeout_ms: int,
                 slow_delay_s: float = 0.4, loss_percent: int = 30) -> None:
        self.cluster = cluster
        self.nodes = cluster.nodes
        self.history = history
        self.firewall = firewall
        self.relay = relay
        self.rng = random.Random(f"{seed}-nemesis")
        self.timeout_s = node_timeout_ms / 1000
        self.slow_delay_s = slow_delay_s
        self.loss_percent = loss_percent
        self._cycle = 0

    # -- the schedule -------------------------------------------------------

    def run(self, kind: str, duration_s: float) -> None:
        """Cycles of ``kind`` until ``duration_s`` from now (the last one completes)."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
        deadline = time.monotonic() + duration_s
        # A first quiet moment: the history starts with a healthy cluster.
        self._hold(min(1.0, duration_s / 4))
        while time.monotonic() < deadline:
            getattr(self, f"_{kind}")()
            self._cycle += 1
            self._recover(deadline)

    def _hold(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _recover(self, deadline: float) -> None:
        """Let the cluster heal (at most until ``deadline``), then a quiet second."""
        end = min(deadline, time.monotonic() + 3 * self.timeout_s + 5)
        while time.monotonic() < end and not self.cluster.healthy():
            time.sleep(0.1)
        self._hold(min(1.0, max(0.0, deadline - time.monotonic())))

    def _fault_hold(self) -> float:
        """How long a fault lasts: past the node timeout, so failures are detected."""
        return self.timeout_s * 2 + self.rng.uniform(0.5, 1.5)

    def _observe(self, fault: Fault, until: float, seen: Callable[[], str | None]) -> None:
        """Poll ``seen`` until ``until``; record the first effect it reports."""
        while time.monotonic() < until:
            effect = _quiet(seen)
            if effect:
                fault.effects.append(f"{self.history.now():.1f}s: {effect}")
                break
            time.sleep(0.1)
        self._hold(max(0.0, until - time.monotonic()))

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

    # -- fault kinds ----------------------------------------------------------

    def _partition(self) -> None:
        nodes = list(self.nodes)
        self.rng.shuffle(nodes)
        pattern = ("majority", "bridge", "one-way")[self._cycle % 3]
        if pattern == "majority":
            minority, majority = nodes[: (len(nodes) - 1) // 2], nodes[(len(nodes) - 1) // 2:]
            cut = [(a, b) for a in minority for b in majority]
            rules = [Drop(a.ip, b.ip) for x, y in cut for a, b in ((x, y), (y, x))]
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
        fault = self.history.fault("partition", f"{pattern}: {text}",
                                   [n.name for n in self.nodes])
        self.firewall.apply(rules)
        self._observe(fault, time.monotonic() + self._fault_hold(),
                      self._flagged(victims, observers))
        fault.effects.append(f"{self.firewall.dropped_packets()} packets dropped")
        self.firewall.heal()
        fault.end = self.history.now()

    def _lossy(self) -> None:
        rules = [Drop(a.ip, b.ip, self.loss_percent) for a, b in permutations(self.nodes, 2)]
        fault = self.history.fault("lossy", f"{self.loss_percent}% loss between all nodes",
                                   [n.name for n in self.nodes])
        self.firewall.apply(rules)
        self._hold(self._fault_hold())
        fault.effects.append(f"{self.firewall.dropped_packets()} packets dropped")
        self.firewall.heal()
        fault.end = self.history.now()

    def _slow(self) -> None:
        victim = self.rng.choice(self.nodes)
        rules = []
        for a, b in combinations(self.nodes, 2):
            if victim not in (a, b):
                continue
            for src, dst in ((a, b), (b, a)):
                port = self.relay.add(dst.ip, BUS_PORT, self.slow_delay_s)
                rules.append(Redirect(src.ip, dst.ip, BUS_PORT, port))
        fault = self.history.fault(
            "slow", f"{victim.name}'s bus links delayed {self.slow_delay_s * 1000:.0f} ms "
            "each way", [victim.name])
        before = self.relay.forwarded
        self.firewall.apply(rules)
        self._hold(self._fault_hold())
        fault.effects.append(f"{self.relay.forwarded - before} bytes relayed late, "
                             f"{self.firewall.dropped_packets()} direct packets reset")
        self.firewall.heal()
        self.relay.clear()
        fault.end = self.history.now()

    def _pause(self) -> None:
        victim = self.rng.choice(self.nodes)
        fault = self.history.fault("pause", f"SIGSTOP {victim.name}", [victim.name])
        victim.pause()
        others = [n for n in self.nodes if n is not victim]
        self._observe(fault, time.monotonic() + self._fault_hold(),
                      self._flagged([victim], others))
        victim.resume()
        fault.end = self.history.now()

    def _kill(self) -> None:
        victim = self.rng.choice(self.nodes)
        persistence = "AOF fsync always" if victim.aof else "no AOF: its jobs are lost"
        fault = self.history.fault("kill", f"SIGKILL {victim.name} ({persistence})",
                                   [victim.name])
        fault.lost_for_good = not victim.aof
        victim.kill()
        others = [n for n in self.nodes if n is not victim]
        self._observe(fault, time.monotonic() + self._fault_hold(),
                      self._flagged([victim], others))
        victim.start()
        fault.end = self.history.now()

    # -- healing --------------------------------------------------------------

    def heal_all(self) -> None:
        """Undo everything: rules, relays, pauses, dead nodes."""
        self.firewall.heal()
        self.relay.clear()
        for node in self.nodes:
            node.resume()
            if not node.alive():
                node.start()


def _names(nodes: list[Node]) -> str:
    return ",".join(n.name for n in nodes)


def _quiet(check: Callable[[], str | None]) -> str | None:
    """``check()``, with a node that does not answer counting as no effect yet."""
    try:
        return check()
    except (redis.RedisError, OSError):
        return None
