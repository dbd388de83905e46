"""The harness's own network namespace: only loopback, nothing leaves it.

The harness re-executes itself under ``unshare -n -m`` so that its clients,
the nodes it starts and the nft rules it writes all live in a network
namespace created for this run, and the filesystems it mounts for the disk
faults (faults/disk.py) in a private mount namespace; both disappear, with
every rule and mount in them, when the last process in them exits.  Every
fault is refused unless we are in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn

#: Set in the environment of the re-executed harness.
ENV_FLAG = "FAULTS_IN_NETNS"


def unavailable_reason() -> str | None:
    """Why the harness cannot run here, or None when it can."""
    for tool in ("unshare", "ip", "nft"):
        if shutil.which(tool) is None:
            return (f"{tool!r} not found (the harness needs util-linux, iproute2 and "
                    "nftables: apt-get install nftables)")
    probe = subprocess.run(["unshare", "-n", "-m", "--propagation", "private", "--", "nft",
                            "list", "ruleset"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return ("cannot create a network namespace with nftables in it "
                f"(unshare -n -m: {probe.stderr.strip() or probe.returncode}); needs root "
                "or CAP_SYS_ADMIN + CAP_NET_ADMIN")
    return None


def in_namespace() -> bool:
    """True in the re-executed harness, inside its private namespace."""
    return os.environ.get(ENV_FLAG) == "1"


def reexec_in_namespace(module: str, argv: Sequence[str]) -> NoReturn:
    """Replace this process by ``python -m module argv`` inside new namespaces."""
    env = dict(os.environ, **{ENV_FLAG: "1"})
    os.execvpe("unshare", ["unshare", "-n", "-m", "--propagation", "private", "--",
                           sys.executable, "-m", module, *argv], env)


def enter(module: str, argv: Sequence[str]) -> str | None:
    """Make this run ``python -m module argv`` inside its own namespace with
    ``lo`` up: re-executes first when outside it.  Returns why it cannot
    (nothing was done), or None once inside and ready."""
    if not in_namespace():
        reason = unavailable_reason()
        if reason is not None:
            return reason
        reexec_in_namespace(module, argv)
    bring_up_loopback()
    return None


def interfaces() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def bring_up_loopback() -> None:
    """Bring ``lo`` up, after checking it is the only interface (our namespace)."""
    if not in_namespace():
        raise RuntimeError("refusing to touch the network outside the harness's namespace")
    found = interfaces()
    if found != ["lo"]:
        raise RuntimeError(f"expected a namespace with only lo, found {found}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def require_isolated() -> None:
    """Raise unless this process is in a namespace whose only interface is lo."""
    if not in_namespace() or interfaces() != ["lo"]:
        raise RuntimeError("faults are applied only inside the harness's own namespace")
