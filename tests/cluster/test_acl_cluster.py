"""Users (ACL) in a cluster: each node has its own users, and bus messages
are not subject to them (the cluster secret guards the bus): a user limited
to its queues on one node still replicates to nodes that do not know it,
original nodes included (docs/EXTENSIONS.md, "Users and permissions")."""

from __future__ import annotations

import pytest

from tests.server.test_acl import ALICE, login
from tests.server.test_protocol_raw import JOB_ID, Resp
from tests.support.cluster import reference_server, show, with_original
from tests.support.process import DisqueProcess, wait_for


def replicate_and_ack(creator: DisqueProcess, nodes: list[DisqueProcess]) -> None:
    with Resp(creator.port) as c:
        assert c.call("ACL", "SETUSER", *ALICE) == b"OK"
    with login(creator, "alice", "wonderland") as alice:
        job = alice.call("ADDJOB", "orders:1", "x", 5000, "REPLICATE", len(nodes))
        assert JOB_ID.match(job), job
        assert all(show(node, job) is not None for node in nodes)
        assert alice.call("GETJOB", "FROM", "orders:1")[0][1] == job
        assert alice.call("ACKJOB", job) == 1
    wait_for(lambda: all(show(node, job) is None for node in nodes), timeout=20,
             message="the ACK's garbage collection to reach every copy")


def test_a_limited_user_replicates_to_nodes_that_do_not_know_it(make_cluster) -> None:
    nodes = make_cluster(3)
    replicate_and_ack(nodes[0], nodes)
    # The other nodes have only their default user.
    assert [n.client().execute_command("ACL", "USERS") for n in nodes[1:]] == [[b"default"]] * 2


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_with_an_original_node_in_the_cluster(server_factory, tmp_path) -> None:
    with with_original(server_factory, tmp_path) as (ours, original):
        replicate_and_ack(ours[0], [*ours, original])
