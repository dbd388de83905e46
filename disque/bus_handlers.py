"""The job messages of the cluster bus, each to the procedure it belongs to.

The bus (``cluster/bus.py``) knows nothing of jobs: it decodes a message,
finds the sender and calls the handler registered here for its type.  Each
handler lives beside the rule it implements, under the spec's name:
replication (REPLJOB, GOTJOB, ENQUEUE), re-queueing (QUEUED, WILLQUEUE,
WORKING), ACK garbage collection (SETACK, GOTACK, DELJOB), queues (PAUSE,
QLIMIT), federation (NEEDJOBS, YOURJOBS); and the membership's node-return
event (a node flagged failing answers again) to the ACK garbage collection.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Final

from . import ack, copies, federation, replication, requeue
from .cluster import messages
from .queue import receive_pause, receive_qlimit

if TYPE_CHECKING:
    from .cluster.bus import ClusterBus
    from .state import ServerState

__all__ = ["register_job_messages"]

HANDLERS: Final = {
    messages.REPLJOB: copies.receive_repljob,
    messages.GOTJOB: replication.receive_gotjob,
    messages.ENQUEUE: copies.receive_enqueue,
    messages.QUEUED: requeue.receive_queued,
    messages.WILLQUEUE: requeue.receive_willqueue,
    messages.WORKING: requeue.receive_working,
    messages.SETACK: ack.receive_setack,
    messages.GOTACK: ack.receive_gotack,
    messages.DELJOB: ack.receive_deljob,
    messages.PAUSE: receive_pause,
    messages.QLIMIT: receive_qlimit,
    messages.NEEDJOBS: federation.receive_needjobs,
    messages.YOURJOBS: federation.receive_yourjobs,
}


#: Handlers of a whole batched job-ID message (see ClusterBus.batch_handlers).
BATCH_HANDLERS: Final = {
    messages.GOTJOB: replication.receive_gotjobs,
}


def register_job_messages(bus: ClusterBus, state: ServerState) -> None:
    for msg_type, handler in HANDLERS.items():
        bus.handlers[msg_type] = partial(handler, state)
    for msg_type, handler in BATCH_HANDLERS.items():
        bus.batch_handlers[msg_type] = partial(handler, state)
    # The node-return event: acked jobs waiting for that node retry their GC.
    bus.membership.on_node_back = partial(ack.node_reachable_again, state)
