"""The cluster layer: node identity, node table, membership and the bus."""

from .state import ClusterNode, ClusterState, NodesFileError, new_node_id

__all__ = ["ClusterNode", "ClusterState", "NodesFileError", "new_node_id"]
