"""A node whose system clock is stepped while it runs (libfaketime, with
the monotonic clock left real): its timers keep their pace.

When the node's timers read the wall clock, a step forward expired jobs
early, requeued them at once and closed every cluster link as stalled (the
last bytes read looked two minutes old); a step back held requeues and
expiries back by the step.  Skipped where libfaketime is not installed
(Debian package ``faketime``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from faults.nodes import faketime_library
from tests.support.cluster import flags_of, join, node_id, show, wait_joined
from tests.support.process import DisqueProcess, wait_for

LIBRARY = faketime_library()
pytestmark = pytest.mark.skipif(LIBRARY is None,
                                reason="libfaketime not installed (Debian package faketime)")


def faked_node(workdir: Path, offset_file: Path) -> DisqueProcess:
    offset_file.write_text("+0\n")
    program = ["env", f"LD_PRELOAD={LIBRARY}", f"FAKETIME_TIMESTAMP_FILE={offset_file}",
               "FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_CACHE_DURATION=1",
               sys.executable, "-m", "disque.server"]
    return DisqueProcess(workdir, "--cluster-node-timeout", "3000", program=program)


def step_clock(node: DisqueProcess, offset_file: Path, seconds: int) -> None:
    """Step the node's system clock and wait until the node reads it (TIME)."""
    tmp = offset_file.with_suffix(".tmp")
    tmp.write_text(f"{seconds:+d}\n")
    tmp.replace(offset_file)
    r = node.client()

    def stepped() -> bool:
        sec, usec = r.execute_command("TIME")
        return abs(int(sec) + int(usec) / 1e6 - time.time() - seconds) < 5

    wait_for(stepped, timeout=10, interval=0.1, message="the node's system clock to step")


@pytest.mark.parametrize("step", [+120, -120])
def test_retry_and_ttl_keep_their_pace_when_the_clock_steps(tmp_path: Path, step: int) -> None:
    offset = tmp_path / "offset"
    node = faked_node(tmp_path / "node", offset).start()
    try:
        r = node.client()
        # Delivered: requeued after RETRY 4; TTL 60 (the step is larger).
        job_id = r.execute_command("ADDJOB", "q", "body", 0, "RETRY", 4, "TTL", 60)
        assert r.execute_command("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
        delivered = time.monotonic()
        step_clock(node, offset, step)
        wait_for(lambda: r.execute_command("QLEN", "q") == 1, timeout=10, interval=0.05,
                 message="the requeue after RETRY (a step forward expired the job, a step "
                         "back postponed it by the step)")
        assert 3.5 < time.monotonic() - delivered < 8
        fields = show(node, job_id)
        assert fields is not None and 50 <= int(fields[b"ttl"]) <= 60, fields
        assert abs(int(r.info("server")["clock_skew_ms"]) - step * 1000) < 5000
        assert f"The system clock moved by {step:+d}"[:28] in node.log_text()
    finally:
        node.kill()


def test_a_clock_step_forward_does_not_close_the_cluster_links(tmp_path: Path) -> None:
    offset = tmp_path / "offset"
    node = faked_node(tmp_path / "node", offset).start()
    peer = DisqueProcess(tmp_path / "peer", "--cluster-node-timeout", "3000").start()
    try:
        join([node, peer])
        wait_joined([node, peer])
        step_clock(node, offset, +120)
        # Two cron rounds of the bus's stalled-link check (every 100 ms) and a
        # ping round: the links stay, nobody is flagged.
        r = node.client()
        wait_for(lambda: int(r.info("server")["clock_skew_ms"]) > 100_000, timeout=5,
                 interval=0.05, message="the node to see the step")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert "Closing a stalled cluster bus link" not in node.log_text()
            assert not (flags_of(node, node_id(peer)) or set()) & {"fail?", "fail"}
            time.sleep(0.2)
    finally:
        node.kill()
        peer.kill()
