"""A disk that fills up, or fails, under a node's AOF (``appendfsync always``).

The node's directory is a small ext4 filesystem on a loop device, mounted in
a mount namespace of its own (faults/disk.py): *full* leaves no free block
(``write`` fails with ENOSPC), *failing* fills the tmpfs under the image so
that the device fails its writes (``fsync`` gets an I/O error while
``write`` still succeeds into the page cache).  The node must never
acknowledge what it could not write: each ADDJOB or ACKJOB answers with
success, -MISCONF, or not at all (a dropped connection); reads are served;
writes resume by themselves once the disk has room; and after a SIGKILL
every job whose ADDJOB answered an ID is still there.  Needs root (mount
namespaces, loop devices): skipped with the reason otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from faults.disk import MountNamespace, SmallDisk, unavailable_reason
from tests.persistence.conftest import persistence, present, show
from tests.support.cluster import join, node_id, wait_joined
from tests.support.process import DisqueProcess, wait_for

pytestmark = pytest.mark.slow

_UNAVAILABLE = unavailable_reason()
if _UNAVAILABLE is not None:
    pytest.skip(f"disk faults need a private mount namespace and loop devices: "
                f"{_UNAVAILABLE}", allow_module_level=True)


@pytest.fixture
def ns() -> Iterator[MountNamespace]:
    namespace = MountNamespace()
    yield namespace
    namespace.close()


@pytest.fixture
def disk_node(tmp_path: Path, ns: MountNamespace) -> Iterator[tuple[DisqueProcess, SmallDisk]]:
    """A node (AOF, appendfsync always) whose directory is a small disk."""
    disk = SmallDisk(tmp_path / "disk", ns=ns)
    node = DisqueProcess(tmp_path / "node", "--dir", str(disk.data), "--appendonly", "yes",
                         "--appendfsync", "always",
                         program=ns.wrap([sys.executable, "-m", "disque.server"]))
    node.start()
    yield node, disk
    node.kill()


@pytest.fixture
def peer(tmp_path: Path, disk_node: tuple[DisqueProcess, SmallDisk]) -> Iterator[DisqueProcess]:
    """A second node (no AOF) in a cluster with the disk node."""
    node, _ = disk_node
    # Queue names longer than a disk block (max-queue-name-len is 1024 by default).
    other = DisqueProcess(tmp_path / "peer", "--max-queue-name-len", "64kb").start()
    try:
        join([node, other])
        wait_joined([node, other])
        yield other
    finally:
        other.kill()


def attempt(node: DisqueProcess, *command: object) -> object:
    """One command on a fresh connection: its reply, the error, or None when
    the connection was dropped unanswered."""
    client = redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=30)
    try:
        return client.execute_command(*command)
    except redis.ResponseError as err:
        return err
    except redis.ConnectionError:
        return None
    finally:
        client.close()


def misconf(reply: object) -> bool:
    return isinstance(reply, redis.ResponseError) and str(reply).startswith(
        "MISCONF Errors writing to the AOF file")


def restart_after_crash(node: DisqueProcess) -> redis.Redis:
    node.kill()
    node.start(port=node.port)
    return node.client()


def test_a_full_disk_is_never_acknowledged_and_resumes_by_itself(
        disk_node: tuple[DisqueProcess, SmallDisk], peer: DisqueProcess) -> None:
    node, disk = disk_node
    r = node.client()
    acknowledged = [r.execute_command("ADDJOB", "q", f"before{i}", 0, "REPLICATE", 2)
                    for i in range(20)]
    to_ack = acknowledged[:10]
    disk.fill()
    # Replicated (the ID is answered when the copy's GOTJOB arrives),
    # local and ASYNC ADDJOBs, and ACKJOBs, on the full disk.
    kinds = [("REPLICATE", 2), ("REPLICATE", 1), ("ASYNC",)]
    # (Bodies of 4 KB: the file's last block has room for a few records.)
    adds = [attempt(node, "ADDJOB", "q", f"full{i}".ljust(4096), 0, *kinds[i % 3])
            for i in range(30)]
    acks = [attempt(node, "ACKJOB", job_id) for job_id in to_ack]
    assert any(misconf(reply) for reply in adds + acks), (adds, acks)
    for reply in adds + acks:
        assert misconf(reply) or reply is None or not isinstance(reply, Exception), reply
    acknowledged += [reply for reply in adds if isinstance(reply, bytes)]
    acked = [job_id for job_id, reply in zip(to_ack, acks, strict=True) if reply == 1]
    # Reads are served, and INFO says why writes are not.
    assert r.execute_command("QLEN", "q") >= 10
    assert r.execute_command("SHOW", acknowledged[-1]) is not None
    info = persistence(r)
    assert info["aof_last_write_status"] == "err"
    assert "space" in info["aof_last_write_error"].lower()
    assert "Error writing to the AOF file" in node.log_text()

    # A crash while the disk is full (room is made only afterwards, for
    # the node to start): what was acknowledged had reached the file.
    node.kill()
    disk.heal()
    r = node.start(port=node.port).client()
    assert present(r, acknowledged) == set(acknowledged)
    for job_id in acked:
        fields = show(r, job_id)
        assert fields is None or fields[b"state"] == b"acked", fields

    # Full again, then room again: writes resume by themselves.
    disk.fill()
    replies = [attempt(node, "ADDJOB", "q", "refused".ljust(4096), 0) for _ in range(10)]
    assert misconf(replies[-1]), replies
    acknowledged += [reply for reply in replies if isinstance(reply, bytes)]
    disk.heal()

    def added() -> bytes | None:
        reply = attempt(node, "ADDJOB", "q", "resumed", 0, "REPLICATE", 2)
        return reply if isinstance(reply, bytes) else None

    resumed = wait_for(added, timeout=10, interval=0.2,
                       message="ADDJOB to succeed once the disk has room")
    assert persistence(r)["aof_last_write_status"] == "ok"
    r = restart_after_crash(node)
    assert present(r, [*acknowledged, resumed]) == {*acknowledged, resumed}

    # A node whose disk is full still drains and stops on SIGTERM (its
    # nodes.conf cannot be written: the drain used to raise there).
    disk.fill()
    assert node.stop(timeout=30) == 0
    assert "Draining before shutdown" in node.log_text()


def test_a_failing_device_is_never_acknowledged_and_resumes_after_a_rewrite(
        disk_node: tuple[DisqueProcess, SmallDisk]) -> None:
    node, disk = disk_node
    r = node.client()
    acknowledged = [r.execute_command("ADDJOB", "q", f"before{i}", 0) for i in range(20)]
    disk.break_device()
    # Bodies large enough that each record needs new blocks of the device.
    body = b"x" * 65536
    outcomes = [attempt(node, "ADDJOB", "q", body, 0) for _ in range(40)]
    acknowledged_during = [reply for reply in outcomes if isinstance(reply, bytes)]
    assert any(misconf(reply) for reply in outcomes), outcomes
    assert all(misconf(reply) or reply is None or isinstance(reply, bytes)
               for reply in outcomes), outcomes
    info = persistence(r)
    assert info["aof_last_write_status"] == "err"
    assert info["aof_last_write_error"].startswith("fsync")
    assert "fsync error" in node.log_text()
    assert node.alive(), "the node must not exit on an fsync error"
    assert r.execute_command("QLEN", "q") >= 20       # reads are served
    # The device works again: the node rewrites the whole file from memory
    # (a second fsync of the old one would claim success for lost pages),
    # then accepts writes.
    disk.heal()
    wait_for(lambda: persistence(r)["aof_last_write_status"] == "ok", timeout=20,
             interval=0.2, message="the recovery rewrite")
    after = r.execute_command("ADDJOB", "q", "after", 0)
    assert "rewritten after the fsync error" in node.log_text()
    everything = [*acknowledged, *acknowledged_during, after]
    r = restart_after_crash(node)
    assert present(r, everything) == set(everything)


def test_a_failing_device_fails_small_records_on_a_disk_used_for_a_while(
        disk_node: tuple[DisqueProcess, SmallDisk]) -> None:
    """Blocks a filesystem has written and freed (AOF rewrites delete old
    files) keep their pages under the image, and writes into them would
    succeed on a failing device, as would writes into blocks it reserved
    ahead of a growing file: the fault trims the free blocks and the disk
    reserves none, so the small records of a real workload fail within a
    block or so, also once the AOF is hundreds of kilobytes long."""
    node, disk = disk_node
    r = node.client()
    # A page under every block of the image, as on a disk whose every block
    # was written once (and most freed again) in a long run.
    assert disk.ns is not None
    disk.ns.run("fallocate", "-l", str(disk.size), str(disk.backing / "disk.img"))
    kept = [r.execute_command("ADDJOB", "q", f"kept{i}".ljust(1000), 0) for i in range(300)]
    disk.break_device()
    outcomes = [attempt(node, "ADDJOB", "q", f"small{i}", 0) for i in range(200)]
    assert any(misconf(reply) for reply in outcomes), outcomes[-3:]
    assert persistence(r)["aof_last_write_error"].startswith("fsync")
    acknowledged = [reply for reply in outcomes if isinstance(reply, bytes)]
    disk.heal()
    wait_for(lambda: persistence(r)["aof_last_write_status"] == "ok", timeout=20,
             interval=0.2, message="the recovery rewrite")
    r = restart_after_crash(node)
    assert present(r, kept + acknowledged) == set(kept + acknowledged)


def test_after_an_fsync_error_a_power_loss_loses_nothing_acknowledged(
        disk_node: tuple[DisqueProcess, SmallDisk], peer: DisqueProcess) -> None:
    """After an fsync error nothing more goes to the old file, and no ACK is
    confirmed that could not be logged.  Records appended after the lost
    pages (an expiry's DELJOB, an ACK from the GC) would turn the lost tail
    into a hole before valid records once the page cache is gone, and the
    node would refuse to start; a confirmed ACK it then forgot would bring
    the job back after its GC completed."""
    node, disk = disk_node
    r, p = node.client(), peer.client()
    durable = [r.execute_command("ADDJOB", "q", f"d{i}", 0) for i in range(10)]
    shared = [p.execute_command("ADDJOB", "q2", f"s{i}", 0, "REPLICATE", 2, "RETRY", 60)
              for i in range(10)]
    expiring = [r.execute_command("ADDJOB", "q", f"e{i}", 0, "TTL", 2) for i in range(10)]
    disk.break_device()
    outcomes = [attempt(node, "ADDJOB", "q", b"x" * 65536, 0) for _ in range(40)]
    assert persistence(r)["aof_last_write_error"].startswith("fsync"), outcomes
    aof = disk.outside(disk.data / "appendonly.aof")
    size = aof.stat().st_size
    for job_id in shared:
        assert p.execute_command("ACKJOB", job_id) == 1
    # The expiries happen (in memory), the peer's GC asks: nothing is
    # written to the old file, and no copy here takes the ACK.
    wait_for(lambda: all(show(r, j) is None for j in expiring), timeout=10,
             message="the TTL 2 jobs to expire")
    for job_id in shared:
        fields = show(r, job_id)
        assert fields is not None and fields[b"state"] != b"acked", fields
    assert aof.stat().st_size == size
    # A power loss while the device still failed: the page cache is gone.
    node.kill()
    disk.heal()
    disk.remount()
    r = node.start(port=node.port).client()
    assert present(r, durable) == set(durable)
    # The peer's GC completes once the node can log the ACK.
    wait_for(lambda: all(show(n.client(), j) is None for n in (node, peer) for j in shared),
             timeout=30, interval=0.2, message="the GC of the shared jobs")


def test_an_ack_the_node_could_not_log_is_not_collected_by_its_own_gc(
        disk_node: tuple[DisqueProcess, SmallDisk], peer: DisqueProcess) -> None:
    """A copy that took an ACK in memory but could not write it (the SETACK
    arrived as the disk filled: its GOTACK was dropped) must not complete the
    job's GC itself.  Its own GC used to ask the other copies, get their
    GOTACKs and delete the job everywhere; after a crash the node loaded the
    job, un-acked, from its AOF and delivered it again, though every other
    node had forgotten it."""
    node, disk = disk_node
    r, p = node.client(), peer.client()
    # A queue name longer than a block: the node's ACK record cannot fit
    # in the free end of the file's last block once the disk is full.
    job = p.execute_command("ADDJOB", "q" * 6000, "acked", 0, "REPLICATE", 2)
    assert show(r, job) is not None
    disk.fill()
    assert p.execute_command("ACKJOB", job) == 1
    # The node acks its copy in memory (no GOTACK: the write failed),
    # then its own GC asks the peer, which confirms.
    everybody = {node_id(node).encode(), node_id(peer).encode()}

    def gc_confirmed_or_done() -> bool:
        fields = show(r, job)
        return fields is None or set(fields[b"nodes-confirmed"]) >= everybody

    wait_for(gc_confirmed_or_done, timeout=15, interval=0.1,
             message="the node's GC to hear from the peer")
    assert persistence(r)["aof_last_write_status"] == "err"
    fields = show(r, job)
    assert fields is not None and fields[b"state"] == b"acked", fields
    assert show(p, job) is not None, "collected while the node's ACK was not written"

    # A crash before the disk has room: the node's AOF has the job, not
    # its ACK.  The peer still holds the ACK, and its GC completes once
    # the node can log it.
    node.kill()
    disk.heal()
    r = node.start(port=node.port).client()
    wait_for(lambda: show(r, job) is None and show(p, job) is None, timeout=40,
             interval=0.2, message="the GC of the acked job")
