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
from typing import Any

from faults import EXIT_SKIPPED, netns
from faults.nft import Drop, Firewall
from faults.nodes import Cluster, Node, wait_until


def _show(node: Node, job_id: str) -> dict[bytes, Any] | None:
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


def _queued_on(cluster: Cluster, job_id: str) -> list[str]:
    return [n.name for n in cluster.nodes
            if (_show(n, job_id) or {}).get(b"state") == b"queued"]


def requeue_after_pause(root: Path) -> bool:
    """A copy's node paused past RETRY while the job waits queued elsewhere.

    A job with two copies is queued on the node that made it; the node of
    the other copy is stopped (SIGSTOP) for longer than RETRY and the node
    timeout.  When it resumes its copy is due: it sends WILLQUEUE and queues
    it at once, and the QUEUED messages that cross should leave the job
    queued on one node only.  Checked after two more RETRY periods.
    """
    cluster = Cluster(root, 3, 2000, [False, False, False])
    try:
        cluster.start()
        maker = cluster.nodes[0]
        ids = [maker.client().execute_command("ADDJOB", "q", f"b{i}", 5000, "REPLICATE", 2,
                                              "RETRY", 2).decode() for i in range(20)]
        holders: dict[str, Node] = {}
        for job_id in ids:
            show = _show(maker, job_id) or {}
            other = [n for n in cluster.nodes[1:]
                     if n.node_id.encode() in show.get(b"nodes-delivered", [])]
            holders[job_id] = other[0]
        victim = cluster.nodes[1]
        mine = [j for j in ids if holders[j] is victim]
        victim.pause()
        time.sleep(5)  # the fault itself: a pause longer than RETRY and the node timeout
        victim.resume()
        cluster.wait_healthy(20)
        time.sleep(4.5)  # two RETRY periods for the copies to settle
        twice = {j: _queued_on(cluster, j) for j in mine}
        twice = {j: w for j, w in twice.items() if len(w) > 1}
        print(f"{len(mine)} jobs had their other copy on the paused node; "
              f"queued twice afterwards: {len(twice)}")
        for job_id in list(twice)[:3]:
            for n in cluster.nodes:
                copy = _show(n, job_id)
                if copy:
                    print(f"  {job_id} on {n.name}: state={copy[b'state']} "
                          f"nacks={copy[b'nacks']} add={copy[b'additional-deliveries']}")
        return not twice
    finally:
        cluster.stop()


def acked_copy_after_lost_deljob(root: Path) -> bool:
    """A copy acked by SETACK whose DELJOB never arrives: is it collected?

    Job on n1, n2, n3 (made on n1).  n3 is paused, then the job is acked on
    n1: n2 acks its copy on SETACK and confirms; n2 is cut off; n3 resumes,
    confirms, and n1, having every confirmation, deletes its copy and sends
    DELJOB, which cannot reach n2.  The cut lasts about three node timeouts,
    so the bus links (and the DELJOB in them) are torn down.  After healing, n2's
    acked copy should be collected by n2's own GC attempts (the original
    retries GC for every acked copy); it must not wait for the job's TTL.
    """
    cluster = Cluster(root, 3, 2000, [False, False, False])
    firewall = Firewall()
    try:
        cluster.start()
        n1, n2, n3 = cluster.nodes
        job_id = n1.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 3,
                                             "RETRY", 30).decode()
        assert all(_show(n, job_id) for n in cluster.nodes)
        n3.pause()
        assert n1.client().execute_command("ACKJOB", job_id) == 1
        wait_until(lambda: n2.node_id.encode() in (_show(n1, job_id) or {}).get(
            b"nodes-confirmed", []), 10, what="n2 to confirm the ACK")
        firewall.apply(_isolate(n2, [n1, n3]))
        n3.resume()
        wait_until(lambda: _show(n1, job_id) is None and _show(n3, job_id) is None, 10,
                   what="n1 and n3 to delete the job")
        wait_until(lambda: "fail" in " ".join(cluster.flags(n1, n2)), 10,
                   what="n1 to flag n2")
        # The fault goes on for a while after n2 was flagged: links torn down.
        time.sleep(3)
        firewall.heal()
        cluster.wait_healthy(30)
        try:
            # The original's GC attempts of n2's copy (1, 2, 4, 8 s apart)
            # reach n1 and n3 well within this.
            wait_until(lambda: _show(n2, job_id) is None, 15,
                       what="n2's acked copy to be collected")
            return True
        except TimeoutError:
            show = _show(n2, job_id) or {}
            print(f"n2 still holds {job_id}: state={show.get(b'state')} "
                  f"next-awake-within={show.get(b'next-awake-within')} ms "
                  f"(ttl {show.get(b'ttl')} s)")
            return False
    finally:
        cluster.stop()
        firewall.close()


def replica_ttl(root: Path) -> bool:
    """A replicated copy expires with the job: its TTL is the one ADDJOB gave.

    ADDJOB ... TTL 600 REPLICATE 3: SHOW on each of the three nodes must
    report a TTL of at most 600 s, or a copy outlives the job (and an acked
    copy whose DELJOB was lost is only dropped at that expiry).
    """
    cluster = Cluster(root, 3, 2000, [False, False, False])
    try:
        cluster.start()
        job_id = cluster.nodes[0].client().execute_command(
            "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 30, "TTL", 600).decode()
        ttls = {n.name: int((_show(n, job_id) or {}).get(b"ttl", -1)) for n in cluster.nodes}
        print(f"TTL 600 job, SHOW ttl per node: {ttls}")
        return all(0 < ttl <= 600 for ttl in ttls.values())
    finally:
        cluster.stop()


def yourjobs_after_gc(root: Path) -> bool:
    """A job in flight to a consumer's node is acked elsewhere and collected: delivered?

    A job with three copies is queued on n1 (its creator); the bus links
    between n1 and n3 go through the delaying relay (1 s each way), the
    others are fast.  A consumer blocks in GETJOB on n3, so n3 asks for jobs
    (NEEDJOBS) and n1 sends this one (YOURJOBS) on the slow link.  While it
    travels, the job is acked on n2: SETACK/GOTACK/DELJOB between n2 and
    the others are fast, so the GC completes and the job is gone from every
    node.  Then YOURJOBS arrives at n3, which must not deliver the job.
    Found by the lossy schedule, where TCP retransmissions hold a YOURJOBS
    back the same way.
    """
    import threading

    from faults.nft import Redirect
    from faults.nodes import BUS_PORT
    from faults.relay import DelayRelay
    from faults.workload import connect

    cluster = Cluster(root, 3, 5000, [False, False, False])
    firewall = Firewall()
    relay = DelayRelay()
    try:
        cluster.start()
        n1, n2, n3 = cluster.nodes
        job_id = n1.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 3,
                                             "RETRY", 30).decode()
        rules = [Redirect(a.ip, b.ip, BUS_PORT, relay.add(b.ip, BUS_PORT, 1.0))
                 for a, b in ((n1, n3), (n3, n1))]
        firewall.apply(rules)
        wait_until(lambda: relay.forwarded > 0 and cluster.healthy(), 30,
                   what="the n1-n3 links to go through the relay")
        got: list[object] = []
        consumer = threading.Thread(target=lambda: got.append(connect(n3, 15).execute_command(
            "GETJOB", "TIMEOUT", 6000, "FROM", "q")))
        consumer.start()
        wait_until(lambda: (_show(n1, job_id) or {}).get(b"state") != b"queued", 10,
                   what="n1 to send the job to n3")
        assert n2.client().execute_command("ACKJOB", job_id) == 1
        try:
            wait_until(lambda: all(_show(n, job_id) is None for n in cluster.nodes), 0.8,
                       interval=0.01, what="the GC to complete")
            gone = True
        except TimeoutError:
            gone = False
            print("the GC did not complete before YOURJOBS arrived: nothing shown")
        consumer.join(15)
        delivered = bool(got and got[0])
        print(f"job gone from every node after the ACK: {gone}; "
              f"then delivered by n3: {delivered}")
        return not (gone and delivered)
    finally:
        cluster.stop()
        relay.close()
        firewall.close()


def gc_after_heal(root: Path, partition_s: float = 35.0) -> bool:
    """Acked jobs whose GC waits for a partitioned node: gone soon after healing?

    Twenty jobs on n1, n2, n3 (REPLICATE 3) are acked on n1 while n3 is cut
    off for ``partition_s``: the GC's attempts back off (1, 2, 4 ... s) the
    whole time, so without more the next one can be half a minute after the
    heal (up to 180 s after long partitions).  When n3 answers again the
    GC must retry at once: every copy gone within a few seconds.
    """
    cluster = Cluster(root, 3, 2000, [False, False, False])
    firewall = Firewall()
    try:
        cluster.start()
        n1, n2, n3 = cluster.nodes
        ids = [n1.client().execute_command("ADDJOB", "q", f"b{i}", 5000, "REPLICATE", 3,
                                           "RETRY", 60).decode() for i in range(20)]
        firewall.apply(_isolate(n3, [n1, n2]))
        for job_id in ids:
            assert n1.client().execute_command("ACKJOB", job_id) == 1
        time.sleep(partition_s)  # the fault itself: the GC backs off meanwhile
        firewall.heal()
        healed = time.monotonic()

        def left() -> int:
            return sum(_show(n, j) is not None for n in cluster.nodes for j in ids)

        try:
            wait_until(lambda: left() == 0, 200, interval=0.1,
                       what="the acked copies to be collected")
        except TimeoutError:
            print(f"{left()} acked copies still there 200 s after healing")
            return False
        linger = time.monotonic() - healed
        print(f"acked copies lingered {linger:.1f} s after a {partition_s:.0f} s partition "
              f"healed")
        return linger < 10
    finally:
        cluster.stop()
        firewall.close()


SCENARIOS: dict[str, Callable[[Path], bool]] = {
    "ack-during-partition": ack_during_partition,
    "requeue-after-pause": requeue_after_pause,
    "acked-copy-after-lost-deljob": acked_copy_after_lost_deljob,
    "replica-ttl": replica_ttl,
    "yourjobs-after-gc": yourjobs_after_gc,
    "gc-after-heal": gc_after_heal,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SCENARIOS:
        print(f"usage: python3 -m faults.scenarios {{{','.join(SCENARIOS)}}}", file=sys.stderr)
        return 2
    reason = netns.enter("faults.scenarios", argv)
    if reason is not None:
        print(f"faults.scenarios: skipped: {reason}", file=sys.stderr)
        return EXIT_SKIPPED
    with tempfile.TemporaryDirectory(prefix="faults-scenario-") as tmp:
        started = time.monotonic()
        behaved = SCENARIOS[argv[0]](Path(tmp))
        print(f"{argv[0]}: {'ok' if behaved else 'DEFECT'} "
              f"({time.monotonic() - started:.1f} s)")
    return 0 if behaved else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
