"""The test's DNS for nodes that resolve with the system resolver.

A node's ``cluster-discovery`` resolves names with getaddrinfo; glibc reads
/etc/hosts at every resolution. Each node process started through
:func:`in_dns` runs in a mount namespace of its own where /etc/hosts is the
test's file: editing that file (in place) is the cluster's DNS changing, as
a Kubernetes headless Service's or a compose network's answer does when
pods or replicas come and go.  Needs root (a mount namespace), which the
project's test machines have; callers skip with :func:`unavailable`'s reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def in_dns(command: list[str], hosts: Path) -> list[str]:
    """``command``, run with ``hosts`` as its /etc/hosts."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *command]


def publish(hosts: Path, name: str, addresses: list[str]) -> None:
    """``name`` resolves to ``addresses`` (written in place: the bind mounts
    see the same file)."""
    with hosts.open("w") as fh:
        fh.write("".join(f"{address} {name}\n" for address in addresses))


def unavailable() -> str | None:
    """Why :func:`in_dns` cannot work here, or None."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "needs unshare and mount (util-linux)"
    probe = subprocess.run(in_dns(["true"], Path("/dev/null")), capture_output=True,
                           text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot make a mount namespace (root needed): {probe.stderr.strip()}"
    return None
