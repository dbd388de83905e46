"""Minimal reproductions of what the checker found, one function each.

``python3 -m faults.scenarios NAME`` runs one inside the harness's own
namespace and exits 0 when the node behaved (1 when the defect showed, 77
when namespaces are not available); tests/faults/ run them.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from faults import EXIT_SKIPPED, netns
from faults.nft import Drop, Firewall
from faults.nodes import Cluster, Node, wait_until


def _show(node: Node, job_id: str) -> dict[bytes, object] | None:
    reply = node.client().execute_command("SHOW", job_id)
    return None if reply is None else dict(zip(reply[::2], reply[1::2], strict=True))


def _isolate(node: Node, others: list[Node]) -> list[Drop]:
    return [d for o in others for d in (Drop(node.ip, o.ip), Drop(o.ip, node.ip))]


def ack_during_partition(root: Path) -> bool:
    """An ACK while one copy is partitioned away: after healing, is the job gone everywhere?

    Job on n1, n2, n3 (REPLICATE 3), delivered, then n1 is cut off and the
    job acked on n2.  The partition lasts past RETRY (n1 requeues its copy)
    and past the node timeout.  After healing, every copy must go.
    """
    cluster = Cluster(root, 3, 2000, [False, False, False])
    firewall = Firewall()
    try:
        cluster.start()
        n1, n2, n3 = cluster.nodes
        job_id = n3.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 3,
                                             "RETRY", 2).decode()
        jobs = n3.client().execute_command("GETJOB", "NOHANG", "FROM", "q")
        assert jobs and jobs[0][1].decode() == job_id
        firewall.apply(_isolate(n1, [n2, n3]))
        assert n2.client().execute_command("ACKJOB", job_id) == 1
        # Past RETRY (n1 requeues) and the node timeout (n1 flagged fail?).
        wait_until(lambda: b"fail" in n2.client().execute_command("CLUSTER", "NODES")
                   .split(n1.node_id.encode())[1].split(b"\n")[0], 10, what="n1 flagged")
        wait_until(lambda: (_show(n1, job_id) or {}).get(b"state") == b"queued", 10,
                   what="n1 to requeue its copy")
        firewall.heal()
        cluster.wait_healthy(20)
        try:
            wait_until(lambda: all(_show(n, job_id) is None for n in cluster.nodes), 30,
                       what="the acked job to be gone")
            return True
        except TimeoutError:
            for n in cluster.nodes:
                print(f"{n.name}: {_show(n, job_id)}")
            return False
    finally:
        cluster.stop()
        firewall.close()


SCENARIOS: dict[str, Callable[[Path], bool]] = {
    "ack-during-partition": ack_during_partition,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SCENARIOS:
        print(f"usage: python3 -m faults.scenarios {{{','.join(SCENARIOS)}}}", file=sys.stderr)
        return 2
    if not netns.in_namespace():
        reason = netns.unavailable_reason()
        if reason is not None:
            print(f"skipped: {reason}", file=sys.stderr)
            return EXIT_SKIPPED
        netns.reexec_in_namespace("faults.scenarios", argv)
    netns.bring_up_loopback()
    with tempfile.TemporaryDirectory(prefix="faults-scenario-") as tmp:
        started = time.monotonic()
        behaved = SCENARIOS[argv[0]](Path(tmp))
        print(f"{argv[0]}: {'ok' if behaved else 'DEFECT'} "
              f"({time.monotonic() - started:.1f} s)")
    return 0 if behaved else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
