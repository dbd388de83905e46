"""A node whose ADDJOB does only what no ADDJOB can skip: the floor of this design.

Run by ``python3 -m benchmarks.run floor`` (never by users or by the tests'
nodes) as ``python3 benchmarks/floor_node.py --port P --dir D ...``: it takes
the same arguments as ``disque.server``.

Everything is the real node (uvloop, connections, the request parser, the
command table's checks, the reply encoder, the cron) except the ``addjob``
entry of the command table, which becomes :func:`minimal_addjob`.  That
handler keeps the work any ADDJOB of a Python node must do, and nothing
else: a new job ID, one ``Job`` object with its creation, expiry and
requeue times, an entry in a map by ID, a place at the tail of a FIFO and in
a time bucket (so something can requeue or expire it), and the ``+ID``
reply.  Equal times and queue names are shared between jobs as in the
real node, so the memory it holds per job is what a ``Job`` object and its
ID and body cost in the simplest structures.

It leaves out what the real ADDJOB must also do: option and timeout
parsing, the replication, memory and pause rules, the queue's order by
ctime, memory accounting, AOF and keyspace hooks, waking blocked clients,
re-arming the job timer.

Its throughput is therefore an upper bound for the ADDJOB handler of this
design: with this node's ``Job`` class, ID generator and reply type, no
tuning of the real handler can beat it, and the gap between the
two is the most that tuning the handler could still win.  (The request path
that every command shares, parser, dispatch, encoder and event loop, is the
same in both and not bounded by it.)  ``FLOORLEN`` answers how many jobs it
holds, so the benchmark can check that every ADDJOB stored one.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import TYPE_CHECKING, Any

from disque.commands.registry import command
from disque.job import QUEUED, Job
from disque.protocol import ReplyError, Status
from disque.server import main

if TYPE_CHECKING:
    from disque.connection import ClientConnection
    from disque.state import ServerState

TTL_MS = 86_400_000
RETRY_S = 300
BUCKET_SHIFT = 4

_names: dict[bytes, bytes] = {}  # one bytes object per queue name, as the real node keeps
_by_id: dict[bytes, Job] = {}
_fifo: deque[Job] = deque()
_buckets: dict[int, dict[Job, None]] = {}


def minimal_addjob(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """ADDJOB queue body 0, with no options, storing the job as cheaply as Python allows."""
    if len(argv) != 4:
        return ReplyError("ERR the floor node only takes ADDJOB queue body 0")
    now = state.clock.now_ms()
    # Times shared between jobs as the real node does: a floor for memory too.
    queue = _names.setdefault(argv[1], argv[1])
    job = Job(state.ids.next_id(86_400, RETRY_S), queue, argv[2], QUEUED, 1,
              state.next_ctime(now), state.shared_int(now + TTL_MS), 0, RETRY_S,
              state.cluster.myself_set)
    job.qtime = job.awakeme = when = state.shared_int(now + RETRY_S * 1000)
    _by_id[job.id] = job
    _fifo.append(job)
    key = when >> BUCKET_SHIFT
    bucket = _buckets.get(key)
    if bucket is None:
        bucket = _buckets[key] = {}
    bucket[job] = None
    return Status(job.id.decode())


def floorlen(state: ServerState, client: ClientConnection, argv: list[bytes]) -> int:
    """FLOORLEN: jobs stored by :func:`minimal_addjob`."""
    return len(_by_id)


command("addjob", -4, "write denyoom")(minimal_addjob)
command("floorlen", 1, "fast")(floorlen)

if __name__ == "__main__":
    sys.exit(main())
