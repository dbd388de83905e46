"""The cluster layer: node identity, node table, membership and the bus."""

from .node import ClusterNode, new_node_id
from .nodes_file import NodesFileError
from .state import ClusterState

__all__ = ["ClusterNode", "ClusterState", "NodesFileError", "new_node_id"]
