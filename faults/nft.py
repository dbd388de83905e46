"""nftables rules for the faults: drops, random loss, and DNAT to the relay.

All rules live in one table (``inet faults``) of the harness's namespace and
are rewritten as a whole in one ``nft -f`` transaction whenever the set of
active faults changes, so a change is atomic and "heal" is simply the empty
set.  Faults may overlap (the ``mixed`` schedule): each keeps its own tagged
set of rules.  Every address must be in 127.0.0.0/8: nothing is ever sent elsewhere.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from faults.netns import require_isolated

TABLE = "faults"
#: SO_MARK of the relay's upstream sockets: its own connections to a node's
#: bus port must be neither redirected to itself again nor reset.
RELAY_MARK = 0x4A51


def _loopback(address: str) -> str:
    if ipaddress.ip_address(address) not in ipaddress.ip_network("127.0.0.0/8"):
        raise ValueError(f"{address} is not a loopback address")
    return address


@dataclass(frozen=True)
class Drop:
    """Drop every packet from ``src`` to ``dst`` (``percent`` < 100: a lossy link)."""

    src: str
    dst: str
    percent: int = 100

    def filter_rules(self) -> list[str]:
        match = f"ip saddr {_loopback(self.src)} ip daddr {_loopback(self.dst)}"
        if self.percent >= 100:
            return [f"{match} counter drop"]
        return [f"{match} numgen random mod 100 < {int(self.percent)} counter drop"]

    def nat_rules(self) -> list[str]:
        return []


@dataclass(frozen=True)
class Redirect:
    """Connections from ``src`` to ``dst:port`` go to the relay at ``relay_port``.

    DNAT only applies to new connections, so packets of a direct connection
    made before the rule are reset: the node reconnects, through the relay.
    """

    src: str
    dst: str
    port: int
    relay_port: int

    def _match(self) -> str:
        return (f"ip saddr {_loopback(self.src)} ip daddr {_loopback(self.dst)} "
                f"tcp dport {int(self.port)} meta mark != {RELAY_MARK}")

    def filter_rules(self) -> list[str]:
        return [f"{self._match()} counter reject with tcp reset"]

    def nat_rules(self) -> list[str]:
        return [f"{self._match()} dnat ip to 127.0.0.1:{int(self.relay_port)}"]


Rule = Drop | Redirect


class Firewall:
    """The ``inet faults`` table: the rules of the active faults, or none.

    Each fault's rules carry its tag (an nft comment), so that the packets
    they matched are counted per fault even while several faults are active
    and the table is rewritten as they start and heal.
    """

    def __init__(self) -> None:
        require_isolated()
        self._sets: dict[str, list[Rule]] = {}
        self._counted: dict[str, int] = {}
        self._nft("add table inet {t}\n"
                  "add chain inet {t} out {{ type filter hook output priority 0; }}\n"
                  "add chain inet {t} nat {{ type nat hook output priority -100; }}\n")

    @property
    def rules(self) -> list[Rule]:
        return [rule for rules in self._sets.values() for rule in rules]

    def _nft(self, script: str) -> None:
        result = subprocess.run(["nft", "-f", "-"], input=script.format(t=TABLE),
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"nft failed: {result.stderr.strip()}\n{script}")

    def _write(self) -> None:
        """Replace the table's rules by the union of the active sets (one
        transaction), after saving what their counters had matched."""
        for tag, packets in self._counters().items():
            self._counted[tag] = self._counted.get(tag, 0) + packets
        lines = ["flush chain inet {t} out", "flush chain inet {t} nat"]
        for tag, rules in self._sets.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", tag):
                raise ValueError(f"bad rule tag {tag!r}")
            note = f' comment "{tag}"'
            for rule in rules:
                lines += [f"add rule inet {{t}} out {r}{note}" for r in rule.filter_rules()]
                lines += [f"add rule inet {{t}} nat {r}{note}" for r in rule.nat_rules()]
        self._nft("\n".join(lines) + "\n")

    def set(self, tag: str, rules: Sequence[Rule]) -> None:
        """Add (or replace) the rules of one fault."""
        self._sets[tag] = list(rules)
        self._write()

    def clear(self, tag: str) -> None:
        """The fault ``tag`` healed: its rules go."""
        if self._sets.pop(tag, None) is not None:
            self._write()

    def apply(self, rules: Sequence[Rule]) -> None:
        """Make ``rules`` the only active ones."""
        self._sets = {"rules": list(rules)}
        self._write()

    def heal(self) -> None:
        self._sets = {}
        self._write()

    def _counters(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.ruleset().splitlines():
            match = re.search(r'counter packets (\d+) .*comment "([^"]+)"', line)
            if match:
                counts[match[2]] = counts.get(match[2], 0) + int(match[1])
        return counts

    def dropped_packets(self, tag: str | None = None) -> int:
        """Packets the rules matched (of one fault, or of all since the last
        :meth:`apply`): proof that a fault bit."""
        current = self._counters()
        if tag is None:
            return sum(current.values())
        return self._counted.get(tag, 0) + current.get(tag, 0)

    def ruleset(self) -> str:
        return subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True,
                              text=True, check=True).stdout

    def close(self) -> None:
        self._nft("delete table inet {t}\n")
