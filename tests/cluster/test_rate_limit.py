"""QLIMIT across real nodes (docs/EXTENSIONS.md, "Rate limits"): BCAST sets
the limit on every node of ours and never sends the original a message it
does not know; a node whose window is full does not pull jobs from the
others (federation does not dodge the limit)."""

from __future__ import annotations

import time

import pytest

from tests.server.test_protocol_raw import Resp, pack
from tests.support.cluster import fully_joined, reference_server, with_original
from tests.support.process import DisqueProcess, wait_for


def limits(nodes: list[DisqueProcess], queue: str) -> list[list[int] | None]:
    return [node.client().execute_command("QLIMIT", queue) for node in nodes]


def test_bcast_sets_and_lifts_the_limit_on_every_node(make_cluster) -> None:
    nodes = make_cluster(3)
    a = nodes[0].client()
    assert a.execute_command("QLIMIT", "api", 10, 1000, "BCAST") == b"OK"
    wait_for(lambda: limits(nodes, "api") == [[10, 1000]] * 3, timeout=10,
             message="every node to take the limit")
    assert a.execute_command("QLIMIT", "api", 4, 250, "bcast") == b"OK"
    wait_for(lambda: limits(nodes, "api") == [[4, 250]] * 3, timeout=10,
             message="every node to take the new limit")
    assert a.execute_command("QLIMIT", "api", "OFF", "BCAST") == b"OK"
    wait_for(lambda: limits(nodes, "api") == [None] * 3, timeout=10,
             message="every node to lift the limit")


def test_a_full_window_does_not_pull_jobs_from_other_nodes(make_cluster) -> None:
    limited, other, _ = make_cluster(3)
    o = other.client()
    for i in range(10):
        o.execute_command("ADDJOB", "rq", f"j{i}", 0, "REPLICATE", 1)
    lc = limited.client()
    assert lc.execute_command("QLIMIT", "rq", 1, 60_000) == b"OK"
    lc.execute_command("ADDJOB", "rq", "local", 0, "REPLICATE", 1)
    assert lc.execute_command("GETJOB", "FROM", "rq")[0][2] == b"local"  # the window is full
    with Resp(limited.port) as consumer:
        consumer.send(pack("GETJOB", "TIMEOUT", 4000, "FROM", "rq"))
        started = time.monotonic()

        def timed_out_without_importing() -> bool:
            # Polled until the consumer's 4 s: the jobs must stay where they are.
            assert o.execute_command("QLEN", "rq") == 10
            assert lc.execute_command("QLEN", "rq") == 0
            return time.monotonic() - started > 4.5

        wait_for(timed_out_without_importing, timeout=10, interval=0.1,
                 message="the consumer's timeout")
        assert consumer.read() is None  # it waited for the window, not for jobs
    # Without the limit the same consumer imports at once.
    assert lc.execute_command("QLIMIT", "rq", "OFF") == b"OK"
    got = lc.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", "rq")
    assert got and got[0][0] == b"rq"


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_bcast_skips_an_original_node(server_factory, tmp_path) -> None:
    with with_original(server_factory, tmp_path) as (ours, original):
        assert ours[0].client().execute_command("QLIMIT", "api", 3, 1000, "BCAST") == b"OK"
        wait_for(lambda: limits(ours, "api") == [[3, 1000]] * 2, timeout=10,
                 message="our other node to take the limit")
        # The original got nothing it does not know: no warning in its log,
        # no link dropped, and PAUSE ... BCAST still reaches it.
        assert ours[0].client().execute_command("PAUSE", "api", "in", "bcast") == b"in"
        wait_for(lambda: original.client().execute_command("PAUSE", "api", "state") == b"in",
                 timeout=10, message="the original to get the PAUSE")
        assert "unknown" not in original.log_text().lower()
        assert fully_joined([*ours, original])
