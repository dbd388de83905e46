"""nftables rules for the faults: drops, random loss, and DNAT to the relay.

All rules live in one table (``inet faults``) of the harness's namespace and
are rewritten as a whole in one ``nft -f`` transaction whenever the set of
active faults changes, so a change is atomic and "heal" is simply the empty
set.  Every address must be in 127.0.0.0/8: nothing is ever sent elsewhere.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
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
    """The ``inet faults`` table: set the active rules, or none."""

    def __init__(self) -> None:
        require_isolated()
        self.rules: list[Rule] = []
        self._nft("add table inet {t}\n"
                  "add chain inet {t} out {{ type filter hook output priority 0; }}\n"
                  "add chain inet {t} nat {{ type nat hook output priority -100; }}\n")

    def _nft(self, script: str) -> None:
        result = subprocess.run(["nft", "-f", "-"], input=script.format(t=TABLE),
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"nft failed: {result.stderr.strip()}\n{script}")

    def apply(self, rules: list[Rule]) -> None:
        """Replace the active rules by ``rules`` (one transaction)."""
        lines = ["flush chain inet {t} out", "flush chain inet {t} nat"]
        for rule in rules:
            lines += [f"add rule inet {{t}} out {r}" for r in rule.filter_rules()]
            lines += [f"add rule inet {{t}} nat {r}" for r in rule.nat_rules()]
        self._nft("\n".join(lines) + "\n")
        self.rules = list(rules)

    def heal(self) -> None:
        self.apply([])

    def dropped_packets(self) -> int:
        """Packets the active rules' counters matched: proof that a fault bit."""
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", self.ruleset()))

    def ruleset(self) -> str:
        return subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True,
                              text=True, check=True).stdout

    def close(self) -> None:
        self._nft("delete table inet {t}\n")
