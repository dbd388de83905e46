"""The metrics endpoint in a cluster: bus link states per peer and the
replication latency histogram, on real nodes."""

from __future__ import annotations

from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, node_id, wait_joined
from tests.support.metrics import scrape, value
from tests.support.process import free_port, wait_for


def test_link_states_and_replication_latency(server_factory) -> None:
    port = free_port()
    timeout = str(TEST_NODE_TIMEOUT_MS)
    a = server_factory("--cluster-node-timeout", timeout, "--metrics-port", str(port))
    b = server_factory("--cluster-node-timeout", timeout)
    join([a, b])
    wait_joined([a, b])
    peer = {"node": node_id(b), "address": f"127.0.0.1:{b.port}"}
    samples = scrape(port)
    assert value(samples, "disque_cluster_link_up", **peer) == 1
    assert value(samples, "disque_cluster_node_state", **peer, state="ok") == 1
    assert value(samples, "disque_cluster_node_state", **peer, state="fail") == 0
    assert value(samples, "disque_cluster_known_nodes") == 2
    assert value(samples, "disque_cluster_reachable_nodes") == 1
    assert value(samples, "disque_cluster_messages_received_total", type="pong") > 0
    assert value(samples, "disque_cluster_messages_refused_total") == 0

    for i in range(5):
        a.client().execute_command("ADDJOB", "q", f"job{i}", 0, "REPLICATE", 2)
    samples = scrape(port)
    assert value(samples, "disque_replication_latency_seconds_count") == 5
    assert value(samples, "disque_replication_latency_seconds_bucket", le="+Inf") == 5
    assert 0 < value(samples, "disque_replication_latency_seconds_sum") < 5 * 10
    assert value(samples, "disque_cluster_messages_received_total", type="gotjob") == 5

    b.kill()

    def peer_failing() -> bool:
        now = scrape(port)
        return (value(now, "disque_cluster_link_up", **peer) == 0 and
                (value(now, "disque_cluster_node_state", **peer, state="pfail") == 1 or
                 value(now, "disque_cluster_node_state", **peer, state="fail") == 1))

    wait_for(peer_failing, timeout=30, interval=0.1, message="the dead peer to show")
    assert value(scrape(port), "disque_cluster_reachable_nodes") == 0
