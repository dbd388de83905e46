"""Synchronous replication of new jobs (the spec's ADDJOB with REPLICATE n).

A job added with REPLICATE n > 1 is copied to n - 1 other nodes (n under
*external replication*, when this node keeps no copy) before the client
gets its ID:

1. The job waits in ``wait-repl``; ``confirmed`` starts as {myself} ({}
   under external replication).  REPLJOB, with the full node list, goes to
   ``needed`` reachable, linked nodes picked at random; for a job of an
   ordered group, the first ones of the key's rendezvous ranking (our
   nodes before original ones, which ignore groups), so that every job of
   a group has its copies on the same nodes (:func:`_group_targets`).  The job is not in
   the schedule meanwhile: the 50 ms timer below expires it if its TTL
   passes (-NOREPL, as process_job's expiry would give).
2. Each copy's node answers GOTJOB.  With n confirmations the job is
   *replication achieved*: queued here (or, under external replication,
   ENQUEUE goes to one of the copies and the local object is dropped), and
   the client gets the ID.
3. Every 50 ms without enough confirmations one more node is added and the
   unconfirmed ones get REPLJOB again, with the new node list (a node that
   died after being picked).  When no node is left to add, the silent ones
   get it again once a second only (a message lost with a dropped link):
   under load a confirmation takes longer than 50 ms, and re-sending every
   waiting job every 50 ms would only add to the load.
4. ``ms-timeout`` passes (or the client disconnects) first: ``-NOREPL``,
   and the partial copies are deleted with DELJOB.

With ASYNC (or REPLICATE 1 under external replication) the client gets the
ID at once and REPLJOB goes out once, with NOREPLY.

:func:`receive_gotjob` counts the confirmations.  The receiving side
(REPLJOB, ENQUEUE) is ``copies.py``.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any, Final

from .cluster import messages
from .cluster.messages import CAP_BATCH
from .job import ACTIVE, WAIT_REPL, Job, serialize_job
from .job_options import bus_trailer
from .jobs import register_job, unregister_job
from .protocol import ReplyError, status_reply
from .queue import enqueue_job
from .rendezvous import ranking
from .schedule import update_awake_time
from .waiters import ReplicationWait, Waiter, park, unblock

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["BlockedAdd", "abort_all", "acked_while_waiting", "broadcast_repljob_noreply",
           "receive_gotjob", "receive_gotjobs", "replicate_job", "replication_removed"]

log: Final = logging.getLogger("disque.replication")

#: Final: compiled, a C static rather than two lookups (module, attribute).
_perf_counter: Final = time.perf_counter
_random: Final = random.random

#: One more node is asked this often while confirmations are missing.
EXTRA_NODE_PERIOD_S: Final = 0.05
#: The silent nodes of a job get its REPLJOB again this often (ms) when no
#: node could be added.
RESEND_PERIOD_MS: Final = 1000

NOREPL_TIMEOUT: Final = ("NOREPL Timeout reached before replicating to the requested number "
                  "of nodes")
NOREPL_REMOVED: Final = ("NOREPL job removed (expired?) before the requested replication level "
                  "was achieved")


class BlockedAdd(ReplicationWait):
    """A client waiting for its job's copies."""

    def release(self, state: ServerState) -> None:
        replicating = state.replicating
        if self.job.id in replicating:  # not pop(id, None): compiled, a Python-level call
            del replicating[self.job.id]
        if state.idmp.pending:
            # The ADDJOB answers now: its IDMP key stays if the job was added
            # (no longer wait-repl), goes with -NOREPL so a retry adds it.
            settled = state.idmp.settle(self.job.id, self.job.state != WAIT_REPL)
            if settled is not None:
                state.events.idmp_settled(state, settled)

    def timeout_reply(self, state: ServerState) -> Any:
        _drop_partial_copies(state, self.job)
        return ReplyError(NOREPL_TIMEOUT)

    def abandoned(self, state: ServerState) -> None:
        _drop_partial_copies(state, self.job)


def _drop_partial_copies(state: ServerState, job: Job) -> None:
    """Replication failed: forget the job here and, best effort, everywhere."""
    if state.jobs.get(job.id) is job:
        state.cluster.broadcast_deljob(job.id, job.delivered)
        unregister_job(state, job)


# --------------------------------------------------------------------------
# Sending side
# --------------------------------------------------------------------------

def _repljob(state: ServerState, job: Job, noreply: bool) -> bytes:
    """A whole REPLJOB frame, for a job with extension options (the trailer
    after its blob describes the jobs of its own message)."""
    blob = serialize_job(job, bus_now_ms=state.clock.now_ms())
    return state.cluster.jobs_message(messages.REPLJOB, [blob],
                                      messages.MFLAG_NOREPLY if noreply else 0,
                                      bus_trailer((job,)))


def _send_copies(state: ServerState, job: Job, ask: bool, inform: bool, now: int) -> None:
    """REPLJOB to the job's other nodes: with ``ask``, to those that have not
    confirmed (GOTJOB expected); with ``inform``, NOREPLY to those that have
    (or to all of them without ``ask``), to learn the node list.

    A job of the original's kind travels as its blob, handed to each link
    (``BusLink.send_entry``): between our nodes the blobs of a turn leave as
    one REPLJOB, without a message of its own made per job and sliced apart
    again at flush time; the original still gets one REPLJOB per job.
    """
    cluster = state.cluster
    myself = cluster.myself.id
    confirmed = job.confirmed
    if job.ext is not None:
        ask_frame = _repljob(state, job, noreply=False) if ask else b""
        inform_frame = b""
        for node_id in job.delivered:
            if node_id == myself:
                continue
            if ask and node_id not in confirmed:
                cluster.send(node_id, ask_frame)
            elif inform:
                inform_frame = inform_frame or _repljob(state, job, noreply=True)
                cluster.send(node_id, inform_frame)
        return
    blob = serialize_job(job, bus_now_ms=now)
    ask_key = cluster.header_key(messages.REPLJOB) if ask else b""
    inform_key = b""
    for node_id in job.delivered:
        if node_id == myself:
            continue
        if ask and node_id not in confirmed:
            cluster.send_entry(node_id, ask_key, blob)
        elif inform:
            inform_key = inform_key or cluster.header_key(messages.REPLJOB,
                                                          messages.MFLAG_NOREPLY)
            cluster.send_entry(node_id, inform_key, blob)


def _add_targets(state: ServerState, job: Job, count: int, now: int) -> int:
    """Add up to ``count`` new reachable, linked nodes to the job's node list."""
    delivered = job.delivered
    cluster = state.cluster
    targets, with_myself = cluster.replication_targets(now)
    if delivered is cluster.myself_set and len(targets) <= count:
        # A new job copied to every other node: the set all such jobs share.
        job.delivered = with_myself
        return len(targets)
    candidates = [node_id for node_id in targets if node_id not in delivered]
    ext = job.ext
    if ext is not None and ext.group is not None and len(candidates) > count:
        chosen = _group_targets(state, ext.group, candidates)[:count]
    else:
        # A random pick among more candidates than needed; all of them otherwise.
        chosen = _random_pick(candidates, count) if len(candidates) > count else candidates
    for node_id in chosen:
        delivered = _with_node(delivered, node_id)
    job.delivered = delivered
    return len(chosen)


def _group_targets(state: ServerState, key: bytes, candidates: list[str]) -> list[str]:
    """The copies of a job of group ``key`` go to the first nodes of the
    key's rendezvous ranking (disque.rendezvous), as the client picks the
    group's home: all the group's jobs then have their copies on the same
    nodes, and after a failure one of them queues the whole group again
    (groups.py).  Our nodes come first: an original node keeps a plain copy
    and queues it again on its own."""
    nodes = state.cluster.nodes
    ranked = ranking(key, candidates)
    ours: list[str] = []
    originals: list[str] = []
    for node_id in ranked:
        node = nodes.get(node_id)
        (ours if node is not None and node.caps & CAP_BATCH else originals).append(node_id)
    return ours + originals


def _random_pick(candidates: list[str], count: int) -> list[str]:
    """``count`` distinct candidates at random: a partial Fisher-Yates
    shuffle on ``random.random()``.  ``random.sample`` is interpreted Python
    (a few microseconds a call), and REPLICATE below the cluster size makes
    this pick for every new job."""
    pool = list(candidates)
    size = len(pool)
    for i in range(count):
        j = i + int(_random() * (size - i))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:count]


def _send_repljob(state: ServerState, job: Job, now: int, list_changed: bool = True) -> None:
    """REPLJOB to every listed node that has not confirmed; when the node list
    changed, the confirmed ones get it too, with NOREPLY, to learn the list."""
    _send_copies(state, job, True, list_changed, now)


def replicate_job(state: ServerState, client: Waiter, job: Job, needed: int, extrepl: bool,
                  timeout_ms: int, async_: bool, now: int = 0) -> Any:
    """Start replicating a new job (ADDJOB's synchronous or ASYNC path).

    Returns the reply for the client now, or None when it must wait (the
    caller answers BLOCKED).  ``now``: the clock's ms, when the caller has
    read it already.
    """
    if not now:
        now = state.clock.now_ms()
    cluster = state.cluster
    job.delivered = frozenset() if extrepl else cluster.myself_set
    _add_targets(state, job, needed, now)
    if async_:
        if extrepl:
            if not job.delivered:
                return ReplyError("NOREPL Not enough reachable nodes for the requested "
                                  "replication level")
            # Nothing is stored here: one recipient queues the job.
            _send_copies(state, job, False, True, now)
            _send_enqueue(state, _enqueue_target(state, job, job.delivered), job)
            return status_reply(job.id)
        job.state = ACTIVE
        _store_achieved(state, job, False)
        _send_copies(state, job, False, True, now)
        return status_reply(job.id)
    job.state = WAIT_REPL
    job.confirmed = frozenset() if extrepl else cluster.myself_set
    # Not scheduled: _add_missing_copies watches its expiry while it waits.
    register_job(state, job, schedule=False)
    blocked = BlockedAdd(client, job, needed, extrepl, now, _perf_counter())
    state.replicating[job.id] = blocked
    if state.replication_timer is None:
        state.replication_timer = state.event_loop().call_later(
            EXTRA_NODE_PERIOD_S, _add_missing_copies, state)
    _send_repljob(state, job, now)
    park(state, blocked, timeout_ms)
    return None


def broadcast_repljob_noreply(state: ServerState, job: Job) -> None:
    """REPLJOB with NOREPLY to the job's other nodes: a new job's copies
    (ASYNC), or copies that must learn a change (a dead-letter move)."""
    _send_copies(state, job, False, True, state.clock.now_ms())


def _add_missing_copies(state: ServerState) -> None:
    """Every 50 ms while jobs wait for copies: for each one that got no new
    node for 50 ms, one more node, and REPLJOB again to the silent ones.

    One timer for all waiting jobs (the original's clientsCron visit), not
    one per job: it runs only while some ADDJOB waits.
    """
    state.replication_timer = None
    if not state.replicating:
        return
    now = state.clock.now_ms()
    period = int(EXTRA_NODE_PERIOD_S * 1000)
    for blocked in list(state.replicating.values()):
        job = blocked.job
        if job.state != WAIT_REPL:
            continue
        if now >= job.etime and state.jobs.get(job.id) is job:
            # Its TTL passed while it waited (it is not in the schedule that
            # expires the others): -NOREPL, as process_job's expiry gives.
            unregister_job(state, job)
            state.stats.expired_jobs += 1
            continue
        if now - blocked.last_added < period:
            continue
        added = _add_targets(state, job, 1, now)
        blocked.last_added = now
        if added or now - blocked.last_sent >= RESEND_PERIOD_MS:
            blocked.last_sent = now
            _send_repljob(state, job, now, list_changed=added > 0)
    state.replication_timer = state.event_loop().call_later(
        EXTRA_NODE_PERIOD_S, _add_missing_copies, state)


def _store_achieved(state: ServerState, job: Job, registered: bool) -> None:
    """The local copy of a job whose replication is achieved: queue (or delay)
    it, register it unless ``registered`` (a synchronous ADDJOB registered it
    before waiting, and a job unregistered meanwhile is no longer waiting: a
    second lookup in the job table, a cache miss per job under load, would
    only confirm it), log it."""
    now = state.clock.now_ms()
    if job.delay:
        job.qtime = now + job.delay * 1000
        if registered:
            update_awake_time(state, job)
        else:
            register_job(state, job)
    else:
        job.qtime = now
        enqueue_job(state, job, now=now)
        if not registered:
            register_job(state, job)
    state.events.job_stored(state, job)


def _enqueue_target(state: ServerState, job: Job, nodes: frozenset[str]) -> str:
    """The copy an externally replicated job is queued at: one at random,
    or for a job of a group the first of ``nodes`` in its key's ranking
    (our nodes first, as the copies were placed)."""
    ext = job.ext
    if ext is not None and ext.group is not None:
        known = [node_id for node_id in nodes if node_id in state.cluster.nodes]
        if known:
            return _group_targets(state, ext.group, known)[0]
    return random.choice(sorted(nodes))


def _send_enqueue(state: ServerState, node_id: str, job: Job) -> None:
    state.cluster.send_job_id(node_id, messages.ENQUEUE, job.id, job.delay)


def _replication_achieved(state: ServerState, blocked: ReplicationWait) -> None:
    job = blocked.job
    state.replication_latency.observe(_perf_counter() - blocked.started)
    if blocked.extrepl:
        # No local copy: one of the copies queues it, ours goes (a group's
        # job: the copy that ranks first for its key, as after a failure).
        _send_enqueue(state, _enqueue_target(state, job, job.confirmed), job)
        state.jobs.schedule.discard(job)
        state.replicating.pop(job.id, None)
        job.state = ACTIVE  # not wait-repl: unregistering must not answer the client
        unregister_job(state, job)
    else:
        job.state = ACTIVE
        _store_achieved(state, job, True)
    # NOREPLY to the nodes still unconfirmed is not needed: they will
    # answer GOTJOB, which is ignored for a job that is no longer waiting.
    persistence = state.logging_persistence
    refused = persistence.refuse_write() if persistence is not None else None
    # While the AOF cannot be written the job stays (queued, with its
    # copies) but is not acknowledged: -MISCONF, as for a write command.
    unblock(state, blocked, status_reply(job.id) if refused is None else refused)


def acked_while_waiting(state: ServerState, job: Job) -> None:
    """The job was acked (a SETACK: somebody processed a copy) while its
    ADDJOB waited for copies: the job exists where it matters, so the
    client gets its ID now rather than -NOREPL later."""
    blocked = state.replicating.get(job.id)
    if blocked is not None and blocked.job is job:
        unblock(state, blocked, status_reply(job.id))


def replication_removed(state: ServerState, job: Job) -> None:
    """A job waiting for its copies was removed (DELJOB, expiry, an ACK's GC)."""
    blocked = state.replicating.get(job.id)
    if blocked is not None and blocked.job is job:
        unblock(state, blocked, ReplyError(NOREPL_REMOVED))


def abort_all(state: ServerState) -> None:
    """DEBUG FLUSHALL / CLUSTER RESET: every waiting ADDJOB gets -NOREPL and
    its partial copies are deleted, before the jobs themselves go."""
    for blocked in list(state.replicating.values()):
        job = blocked.job
        state.cluster.broadcast_deljob(job.id, job.delivered)
        unblock(state, blocked, ReplyError(NOREPL_REMOVED))
    if state.replication_timer is not None:
        state.replication_timer.cancel()
        state.replication_timer = None


# --------------------------------------------------------------------------
# Confirmations (GOTJOB)
# --------------------------------------------------------------------------

def receive_gotjob(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    _confirm(state, sender.id, msg.job_id)


def receive_gotjobs(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """A batched GOTJOB (CAP_BATCH): every entry's confirmation, read from
    the payload as it is rather than made a message each; a failing entry
    does not drop the ones after it."""
    payload = msg.payload
    node_id = sender.id
    for offset in range(0, len(payload) - 43, 44):
        try:
            _confirm(state, node_id, payload[offset:offset + 40])
        except Exception:  # a bug: log it, keep the other confirmations
            log.exception("Error processing a GOTJOB from %s", node_id)


#: node set -> {node ID -> the set with the node}, for the node lists and
#: confirmations of new jobs: every job replicated to the same nodes goes
#: through the same few sets, and a set union costs more than finding it
#: here (and one set shared by many jobs is memory saved).  Two levels
#: rather than a (set, ID) key: no tuple to build and hash per lookup.
_WITH_NODE: Final[dict[frozenset[str], dict[str, frozenset[str]]]] = {}
_WITH_NODE_MAX: Final = 4096


def _with_node(nodes: frozenset[str], node_id: str) -> frozenset[str]:
    by_id = _WITH_NODE.get(nodes)
    if by_id is None:
        if len(_WITH_NODE) >= _WITH_NODE_MAX:
            _WITH_NODE.clear()
        by_id = _WITH_NODE[nodes] = {}
    found = by_id.get(node_id)
    if found is None:
        found = nodes | {node_id}
        if len(by_id) >= _WITH_NODE_MAX:
            by_id.clear()
        by_id[node_id] = found
    return found


def _confirm(state: ServerState, node_id: str, job_id: bytes) -> None:
    """GOTJOB: ``node_id`` holds a copy of the job we wait to replicate."""
    blocked = state.replicating.get(job_id)
    if blocked is None:
        return  # replicated already (a late answer), or not ours
    job = blocked.job
    if job.state != WAIT_REPL:
        return
    confirmed = _with_node(job.confirmed, node_id)
    job.confirmed = confirmed
    if len(confirmed) >= job.repl:
        _replication_achieved(state, blocked)
