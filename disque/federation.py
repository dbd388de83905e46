"""Federation: consumers on one node get the jobs queued on others
(the spec's NEEDJOBS / YOURJOBS).

**Asking.**  A node whose consumers wait on an empty queue asks for jobs:

* **broadcast**: NEEDJOBS(1) to every linked node at once, then every
  ASK_RENEW_MS (1 s) while consumers still wait (the original: every 2 s,
  doubling up to 30 s);
* **ad hoc**: NEEDJOBS(count) to the *responders* (nodes that sent jobs for
  this queue in the last 5 s), every min(25 ms x 2^attempt, 2 s); at once
  when a consumer emptied a queue that imports jobs, when a YOURJOBS left
  consumers still waiting, and at the first need after a YOURJOBS came
  (its sender answered our ask: it holds none of ours any more).  ``count``
  follows the queue's import rate, split between the responders, within
  [5, 100].  (A node due both sends each node one message.)
* **withdrawn**: when the queue's last waiting consumer leaves (it got a
  job, timed out, went away), NEEDJOBS(0) to our nodes that keep an ask of
  ours not answered yet, at most once every ASK_RENEW_MS per queue; the
  next need then broadcasts at once.  Only our nodes are sent it: the
  original would read it as an ask for one job.

**Answering, and pushing.**  A node that receives NEEDJOBS for a queue
remembers the ask for ASK_TTL_MS (3 s; the asker's next NEEDJOBS renews it
in its place: the nodes served longest ago first), as *waiting*, then:

* with jobs to send, **answers** at once with YOURJOBS: up to ``count`` of
  its queued jobs, those it would hand out first (the highest priorities,
  then the oldest; half of them if it has fewer than twice that), as the
  original; the ask is no longer waiting;
* with nothing to send (nothing queued, the queue paused for output, or
  imported here too), keeps it waiting.  When a job is then queued and no
  local consumer waits for it, the job is **pushed**: at the end of the
  event-loop turn (with whatever else the turn queued) the waiting asks
  are answered in their order, as above, while jobs are left.  Jobs that
  no waiting ask takes stay queued, for local consumers or the next
  NEEDJOBS.

One NEEDJOBS, one YOURJOBS at most: the asker's next NEEDJOBS (its
consumers took the jobs and wait again) is what brings the next.  That is
the flow control: jobs queued while no ask waits leave together with the
next answer, and a node whose consumers are busy asks for nothing, so a
backlog moves in batches.  It also bounds what a stale ask costs: a node
whose consumers went away withdraws its asks (or, an original, stops
asking), an ask is forgotten after ASK_TTL_MS at most, and until then it
brings its node one YOURJOBS.  Asks of nodes that leave, fail or are
forgotten are dropped; at most MAX_ASKED_QUEUES queues' asks are kept
(beyond, the original's answer only).

**Under load** (an answer to a node found two jobs or more queued: they
come faster than it asks), answers to it are paced: at most one YOURJOBS
every PUSH_GAP_MS per queue, with what was queued meanwhile, for
LOAD_HOLD_MS after the last such answer.  One job at a time never waits.

The original accepts a YOURJOBS it did not ask for at that moment (it
queues the jobs and counts the sender a responder), and asks as before, so
a mixed cluster federates both ways: our nodes push to an original whose
consumers wait, and answer its asks as the original would.

A YOURJOBS takes its jobs out of the sender's queue (forgotten there if
at-most-once); the importing node queues them and joins their node list,
so the ACK's garbage collection reaches it.

Never: a leaving node asks for jobs; a node exports jobs (answers or pushes)
while it imports the same queue itself (no job bounces from node to node);
an acked job is queued again by an import.

An ordered group (groups.py) moves whole or not at all, answered or pushed: a group's next job
leaves with every job queued behind it, in their order, and only while
none of the group's jobs is out here (nor a copy of an older one: then the
group has no next job to hand out).  The jobs stay here as the group's
copies, so the group's jobs added here later wait until the moved ones are
acknowledged (the ACK's garbage collection reaches this node).  A group
never spans two YOURJOBS (one that does not fit after other jobs waits for
the next), and no group goes when an original node asks (it knows nothing
of groups: it would hand the jobs out to any consumer, in any order).

The asking side's per-queue state lives in ``queue_table.QueueFederation``,
made on first use, so queues that never federate cost nothing; the asks
received are ``QueueRegistry.asks``, by queue name, whether the queue exists
here or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .ack import acked_elsewhere
from .cluster import messages
from .cluster.node import FLAG_FAIL, FLAG_HANDSHAKE, FLAG_LEAVING, FLAG_NOADDR, FLAG_PFAIL
from .copies import adopt_copy, jobs_in, merge_copy
from .groups import queued_jobs
from .job import ACKED, FLAG_BCAST_QUEUED, Job, serialize_job
from .job_options import bus_trailer
from .jobs import register_job, unregister_job
from .queue import enqueue_job, withdraw_job
from .queue_table import PAUSED_OUT, Ask, Queue, QueueFederation
from .requeue import postpone
from .waiters import BlockedGet

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = ["expire_asks", "import_from", "import_rate", "need_jobs", "need_jobs_cron",
           "offer_jobs", "push_jobs", "receive_needjobs", "receive_yourjobs", "send_jobs",
           "waiting_asks", "withdraw_asks"]

#: A node that sent jobs within this long is a responder.
RESPONDER_WINDOW_MS: Final = 5000
#: NEEDJOBS count bounds (the original's), and the most jobs one YOURJOBS carries.
MIN_COUNT, MAX_COUNT = 5, 100
ADHOC_BASE_MS, ADHOC_MAX_MS = 25, 2000
#: While consumers wait, NEEDJOBS goes to every node this often: it renews
#: the asks the other nodes remember (ASK_TTL_MS), and finds new sources.
ASK_RENEW_MS: Final = 1000
#: How long a node remembers an ask: three renewals, so that a late one does
#: not make it forget a node whose consumers still wait.
ASK_TTL_MS: Final = 3 * ASK_RENEW_MS
#: Under load, YOURJOBS of a queue to a node are PUSH_GAP_MS apart at
#: least: jobs queued (or asked for) sooner wait for the gap's end and leave
#: together, so there are at most 1000 / PUSH_GAP_MS YOURJOBS a second (and
#: as many NEEDJOBS) per node and queue however fast jobs come.  Under load
#: means: for LOAD_HOLD_MS after an answer to the node found two jobs or more
#: queued (they came faster than it asked); one job at a time never waits.
PUSH_GAP_MS: Final = 5
LOAD_HOLD_MS: Final = 100
#: Queues whose asks a node remembers at most (each holds one ask per node):
#: beyond, further queues' asks get the original's answer only.
MAX_ASKED_QUEUES: Final = 65_536
#: One YOURJOBS carries at most this many bytes of jobs (at least one job):
#: a receiver refuses a message over its proto-max-bulk-len + 1 MB.
MAX_YOURJOBS_BYTES: Final = 16 * 1024 * 1024
#: Back-off attempts stop growing here (the original's counters overflowed).
MAX_ATTEMPT: Final = 16
#: The import rate is 0 once its newest second is this old.
RATE_STALE_MS: Final = 5000


def _fed(q: Queue) -> QueueFederation:
    if q.fed is None:
        q.fed = QueueFederation()
    return q.fed


def import_rate(q: Queue, now: int) -> int:
    """Jobs per second imported lately (getQueueImportRate)."""
    fed = q.fed
    if fed is None or not fed.cur_start or now - fed.cur_start > RATE_STALE_MS:
        return 0
    start = fed.prev_start or fed.cur_start
    elapsed = max(50, now - start)
    return -(-(fed.prev_count + fed.cur_count) * 1000 // elapsed)


def import_from(q: Queue, now: int) -> list[bytes]:
    """The responders of the last 5 s (QSTAT's ``import-from``)."""
    if q.fed is None:
        return []
    return [node_id.encode() for node_id, when in q.fed.responders.items()
            if now - when <= RESPONDER_WINDOW_MS]


def _count_import(fed: QueueFederation, now: int, jobs: int) -> None:
    if now - fed.cur_start >= 1000:
        fed.prev_start, fed.prev_count = fed.cur_start, fed.cur_count
        fed.cur_start, fed.cur_count = now, 0
    fed.cur_count += jobs


# --------------------------------------------------------------------------
# Asking (NEEDJOBS)
# --------------------------------------------------------------------------

def need_jobs(state: ServerState, q: Queue, reached_zero: bool = False) -> None:
    """needJobsForQueue: ask other nodes for jobs of ``q``, with back-off.

    Not while ``q``'s rate limit holds its consumers back (its window is
    full): they wait for the window, not for jobs, and jobs brought here
    would only wait too.  Nor more than the window still lets through.
    """
    cluster = state.cluster
    if cluster.leaving or len(cluster.nodes) == 1:
        return
    now = state.clock.now_ms()
    limit = q.limit
    room = limit.left(now) if limit is not None else MAX_COUNT
    if not room:
        return
    fed = _fed(q)
    for node_id in [n for n, when in fed.responders.items()
                    if now - when > RESPONDER_WINDOW_MS or n not in cluster.nodes]:
        del fed.responders[node_id]
    bcast = fed.withdrawn or now - fed.bcast_time > ASK_RENEW_MS
    adhoc = bool(fed.responders) and (reached_zero or now - fed.adhoc_time > min(
        ADHOC_BASE_MS << fed.adhoc_attempt, ADHOC_MAX_MS))
    if not bcast and not adhoc:
        return
    # One message per node: the responders get the ad hoc count when it is
    # their turn, everybody the broadcast's NEEDJOBS(1) when it is due.  The
    # broadcast is not backed off as the original's (2 s doubling to 30 s):
    # the other nodes remember the ask for ASK_TTL_MS and push the first job
    # that comes, so its renewal is what a job queued there after a long
    # wait needs to come at once.
    single = cluster.queue_message(messages.NEEDJOBS, q.name, 1) if bcast else b""
    counted = b""
    if adhoc:
        count = min(MAX_COUNT, room,
                    max(MIN_COUNT, import_rate(q, now) // len(fed.responders)))
        counted = cluster.queue_message(messages.NEEDJOBS, q.name, count)
        fed.adhoc_time = now
        fed.adhoc_attempt = min(fed.adhoc_attempt + 1, MAX_ATTEMPT)
    if bcast:
        fed.bcast_time = now
        fed.withdrawn = False
    sent = 0
    myself = cluster.myself
    for node in list(cluster.nodes.values()):
        link = node.link
        if link is None or node is myself:
            continue
        if adhoc and node.id in fed.responders:
            link.send(counted)
        elif bcast:
            link.send(single)
        else:
            continue
        sent += 1
        if node.caps & messages.CAP_BATCH:
            fed.asked[node.id] = None  # one of ours: it keeps the ask (withdraw_asks)
    state.stats.needjobs_sent += sent


def withdraw_asks(state: ServerState, q: Queue) -> None:
    """The last consumer waiting on ``q`` left (it got a job, timed out or
    went away): our nodes that keep an ask of ours for ``q`` forget it
    (NEEDJOBS(0), which only our nodes are sent), so that they push nothing
    here that nobody waits for.  At most once every ASK_RENEW_MS per queue,
    so that consumers that block and leave in a loop do not make every ask
    two messages per node: asks not withdrawn stay until ASK_TTL_MS, and
    bring this node one YOURJOBS each at most."""
    fed = q.fed
    if fed is None or not fed.asked or q.waiters:
        return
    now = state.clock.now_ms()
    if now - fed.withdraw_time < ASK_RENEW_MS:
        return
    fed.withdraw_time = now
    # The next need asks every node again at once, not at the next renewal.
    fed.withdrawn = True
    cluster = state.cluster
    message = cluster.queue_message(messages.NEEDJOBS, q.name, 0)
    for node_id in fed.asked:
        state.stats.needjobs_sent += cluster.send(node_id, message)
    fed.asked.clear()


def need_jobs_cron(state: ServerState) -> None:
    """Every cron run: queues with blocked consumers keep asking (the
    original's clientsCron visit to blocked clients); the other nodes'
    expired asks are dropped."""
    if state.queues.asks:
        expire_asks(state, state.clock.now_ms())
    if len(state.cluster.nodes) == 1 or not state.blocked_clients:
        return
    asked: set[bytes] = set()
    for client in list(state.clients.values()):
        blocked = client.blocked
        if not isinstance(blocked, BlockedGet):
            continue  # not waiting for jobs (a replicating ADDJOB, a WAITJOB)
        for q in blocked.queues:
            if q.name not in asked and not q.jobs:
                asked.add(q.name)
                need_jobs(state, q)


# --------------------------------------------------------------------------
# Answering (NEEDJOBS received, YOURJOBS sent)
# --------------------------------------------------------------------------

def receive_needjobs(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """receiveNeedJobs: send the asker the queued jobs we would hand out
    first; with none to send, remember the ask (see the module's docstring)."""
    if not msg.aux:
        _forget(state, msg.queue, sender.id)  # withdrawn (the original never asks for 0)
        return
    q = state.queues.lookup(msg.queue)
    now = state.clock.now_ms()
    wanted = min(msg.aux, MAX_COUNT)  # bounded: the original overflowed a buffer
    ask = _remember(state, msg.queue, sender.id, now, wanted)
    if q is None or not q.jobs or q.flags & PAUSED_OUT or import_rate(q, now):
        return  # remembered: the jobs queued from now on go to it
    if ask is None:  # not remembered (MAX_ASKED_QUEUES): the original's answer
        jobs = _first_jobs(state, q, sender.id, _answer_size(len(q.jobs), wanted))
        if jobs:
            send_jobs(state, sender.id, jobs)
    elif _held_until(ask, now):
        offer_jobs(state, q)  # paced (under load): answered at the gap's end
    else:
        _answer(state, q, state.queues.asks[msg.queue], sender.id, ask, now)


def _remember(state: ServerState, queue: bytes, node_id: str, now: int,
              wanted: int) -> Ask | None:
    """The ask of ``node_id`` for jobs of ``queue``, new (last) or renewed
    (in its place), waiting; None past MAX_ASKED_QUEUES.  A node
    that asks again before it was answered wants the larger count (a
    broadcast renewal asks for one job, an ad hoc ask for more)."""
    table = state.queues.asks
    asks = table.get(queue)
    if asks is None:
        if len(table) >= MAX_ASKED_QUEUES:
            return None
        asks = table[bytes(queue)] = {}
    ask = asks.get(node_id)
    if ask is None:
        ask = asks[node_id] = Ask(now + ASK_TTL_MS, wanted)
    else:
        ask.until = now + ASK_TTL_MS
        ask.count = max(ask.count, wanted) if ask.waiting else wanted
    ask.waiting = True
    return ask


def _forget(state: ServerState, queue: bytes, node_id: str) -> None:
    table = state.queues.asks
    asks = table.get(queue)
    if asks is not None and asks.pop(node_id, None) is not None and not asks:
        del table[queue]


def _answer(state: ServerState, q: Queue, asks: dict[str, Ask], node_id: str, ask: Ask,
            now: int) -> None:
    """One YOURJOBS for ``ask`` (of ``asks``, ``q``'s): the jobs ``q`` would
    hand out first, as many as :func:`_answer_size` says.  The ask moves to
    the end of the order: the node served longest ago comes first, so that
    nodes whose consumers all wait take turns."""
    queued = len(q.jobs)
    jobs = _first_jobs(state, q, node_id, _answer_size(queued, ask.count))
    if not jobs:
        return  # only groups' jobs, and an original node asks: it keeps waiting
    ask.waiting = False
    ask.sent = now
    del asks[node_id]
    asks[node_id] = ask
    if queued > 1:
        ask.busy_until = now + LOAD_HOLD_MS
    send_jobs(state, node_id, jobs)


def _first_jobs(state: ServerState, q: Queue, node_id: str, count: int) -> list[Job]:
    """The ``count`` jobs of ``q`` to send ``node_id`` first.  No group's
    job goes to an original node (see the module's doc); as ``q``'s order
    holds one job per group at most, looking that much further finds them."""
    groups = q.groups
    if groups is None:
        return q.jobs.first(count)
    node = state.cluster.nodes.get(node_id)
    if node is not None and node.caps & messages.CAP_BATCH:
        return q.jobs.first(count)
    return [job for job in q.jobs.first(count + len(groups.by_key))
            if job.ext is None or job.ext.group is None][:count]


def _held_until(ask: Ask, now: int) -> int:
    """Until when an answer to ``ask`` waits (the pacing under load); 0: it
    goes now."""
    if ask.busy_until > now:
        due = ask.sent + PUSH_GAP_MS
        if due > now:
            return due
    return 0


def _answer_size(queued: int, wanted: int) -> int:
    """How many of ``queued`` jobs a YOURJOBS answering NEEDJOBS(``wanted``)
    carries: ``wanted``, or half of them if that is more than half (at least
    one), so that no one node empties the queue (the original's rule)."""
    return wanted if queued >= 2 * wanted else max(1, queued // 2)


def offer_jobs(state: ServerState, q: Queue) -> None:
    """``q`` got jobs that no local consumer waits for: if other nodes asked
    for jobs of it, push them at the end of the loop turn (:func:`push_jobs`),
    with the rest of what the turn queues."""
    queues = state.queues
    if q.name not in queues.asks or q.name in queues.unclaimed:
        return
    if not queues.unclaimed:
        state.event_loop().call_soon(push_jobs, state)
    queues.unclaimed[q.name] = None


def push_jobs(state: ServerState) -> None:
    """End of the turn (or of a held push's gap): the queues
    :func:`offer_jobs` noted answer the asks waiting for them, the nodes
    served longest ago first; under load an ask answered less than
    PUSH_GAP_MS ago is held until the gap's end."""
    queues = state.queues
    names = list(queues.unclaimed)
    queues.unclaimed.clear()
    now = state.clock.now_ms()
    due = 0
    for name in names:
        q = queues.lookup(name)
        asks = queues.asks.get(name)
        if q is None or asks is None or q.waiters or q.flags & PAUSED_OUT \
                or import_rate(q, now):
            continue  # a local consumer came first; paused; or importing it itself
        held = 0
        for node_id, ask in list(asks.items()):
            if ask.until < now or not _may_take_jobs(state, node_id):
                del asks[node_id]  # stale
                continue
            if not ask.waiting or not q.jobs:
                continue
            due_at = _held_until(ask, now)
            if due_at:
                held = due_at if not held else min(held, due_at)
                continue
            state.stats.yourjobs_pushed += 1
            _answer(state, q, asks, node_id, ask, now)
        if not asks:
            del queues.asks[name]
        elif held and q.jobs:
            queues.held[name] = None
            due = held if not due else min(due, held)
    if due:
        _hold_until(state, due, now)


def _hold_until(state: ServerState, due: int, now: int) -> None:
    """Run :func:`push_jobs` for the held queues at ``due`` (ms)."""
    queues = state.queues
    if queues.push_timer is not None:
        if queues.push_timer_at <= due:
            return
        queues.push_timer.cancel()
    queues.push_timer_at = due
    queues.push_timer = state.event_loop().call_later((due - now) / 1000, _gap_ended, state)


def _gap_ended(state: ServerState) -> None:
    queues = state.queues
    queues.push_timer = None
    for name in queues.held:
        queues.unclaimed[name] = None
    queues.held.clear()
    push_jobs(state)


#: Nodes in these states are sent no jobs: they may never take them.
_NO_JOBS: Final = frozenset((FLAG_LEAVING, FLAG_FAIL, FLAG_PFAIL, FLAG_HANDSHAKE, FLAG_NOADDR))


def _may_take_jobs(state: ServerState, node_id: str) -> bool:
    """A node of the table, linked, not leaving nor failing."""
    node = state.cluster.nodes.get(node_id)
    if node is None or node.link is None:
        return False
    flags = node.flags
    return not flags or flags.isdisjoint(_NO_JOBS)


def expire_asks(state: ServerState, now: int) -> None:
    """Forget the asks past their time, and those of nodes that may no longer
    take jobs (at most once every ASK_RENEW_MS: the table may be large)."""
    queues = state.queues
    if now - queues.asks_swept < ASK_RENEW_MS:
        return
    queues.asks_swept = now
    for name, asks in list(queues.asks.items()):
        for node_id in [n for n, ask in asks.items()
                        if ask.until < now or not _may_take_jobs(state, n)]:
            del asks[node_id]
        if not asks:
            del queues.asks[name]


def waiting_asks(state: ServerState) -> int:
    """Asks remembered and not answered yet (CLUSTER INFO)."""
    return sum(ask.waiting for asks in state.queues.asks.values() for ask in asks.values())


def send_jobs(state: ServerState, node_id: str, jobs: list[Job]) -> int:
    """YOURJOBS: hand ``jobs``, queued here, to ``node_id``; how many went.

    They leave our queue (and are forgotten here if at-most-once); a job of
    an ordered group that is its group's next job takes the group's other
    queued jobs with it (:func:`_whole`).  One message carries at most
    MAX_YOURJOBS_BYTES (at least one job, or one group), the rest stay
    queued.  NEEDJOBS answers with this; so does the drain on SIGTERM
    (drain.py), unasked.
    """
    now = state.clock.now_ms()
    blobs: list[bytes] = []
    sent: list[Job] = []
    size = 0
    for first in jobs:
        unit = _whole(state, first)
        befores = []
        unit_blobs = []
        for job in unit:
            # The receiver holds a copy from now on: the GC must reach it (the
            # original left it out of the node list and could finish the GC early).
            befores.append(job.delivered)
            job.delivered = job.delivered | {node_id}
            unit_blobs.append(serialize_job(job, bus_now_ms=now))
        unit_size = sum(len(blob) for blob in unit_blobs)
        if blobs and size + unit_size > MAX_YOURJOBS_BYTES:
            for job, before in zip(unit, befores, strict=True):
                job.delivered = before  # not sent: stays queued here as it was
            break
        blobs += unit_blobs
        sent += unit
        size += unit_size
        for job in unit:
            if withdraw_job(state, job) and job.ext is not None and job.ext.group is not None:
                # A group's job stays here as a copy: like one told QUEUED, it
                # waits a RETRY and its rank from now, warning first.  Its
                # queue time as a queued job could be less than the warning's
                # 500 ms away (the warning not due any more): it would queue
                # the group here again, unwarned, while the receiver serves it.
                postpone(state, job)
            if job.retry == 0:
                unregister_job(state, job)  # at most once: only the receiver has it now
    stats = state.stats
    stats.yourjobs_sent += 1
    stats.jobs_exported += len(blobs)
    state.cluster.send(node_id, state.cluster.jobs_message(
        messages.YOURJOBS, blobs, trailer=bus_trailer(sent)))
    return len(blobs)


def _whole(state: ServerState, job: Job) -> list[Job]:
    """What leaves with ``job``: itself, or for the next job of an ordered
    group, the group's queued jobs in their order (groups.queued_jobs)."""
    ext = job.ext
    if ext is None or ext.group is None or job.queue is None:
        return [job]
    q = state.queues.lookup(job.queue)
    return queued_jobs(q, job) if q is not None else [job]


def receive_yourjobs(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """receiveYourJobs: queue the jobs another node sent for our consumers."""
    now = state.clock.now_ms()
    myself = state.cluster.myself_set
    imported: dict[bytes, int] = {}
    for copy in jobs_in(msg, sender):
        if copy.state == ACKED:
            continue  # never import an acked job
        job = state.jobs.get(copy.id)
        if job is None and acked_elsewhere(state, copy.id, now):
            continue  # its ACK's GC completed while it travelled
        if job is None:
            job = copy
            adopt_copy(state, job, now)
            job.delivered = job.delivered | myself
            job.qtime = 0
            register_job(state, job)
        else:
            job.delivered = job.delivered | copy.delivered | myself
            if copy.ext is not None:
                merge_copy(state, job, copy)
        if job.state == ACKED:
            continue  # acked here: never queued again (the original's import did)
        job.flags &= ~FLAG_BCAST_QUEUED
        job.qtime = job.qtime or now  # RETRY-0 jobs need a queue time to be queued
        if enqueue_job(state, job, now=now) and job.queue is not None:
            imported[job.queue] = imported.get(job.queue, 0) + 1
            # The sender's copy would be due again at the time it had, less
            # the time the job waited there than ours: tell it (and the other
            # copies) that the job is queued here, so their RETRY restarts
            # with ours (a QUEUED that counts nothing; the original sends none).
            state.cluster.broadcast_queued(job, nack=False, count=False)
    for name, count in imported.items():
        q = state.queues.lookup(name)
        if q is None:
            continue
        fed = _fed(q)
        fed.responders[sender.id] = now
        fed.asked.pop(sender.id, None)  # it answered: it keeps no ask of ours
        # The sender answered our ask and holds it no more: the next need
        # for jobs asks again at once, not after the back-off.
        fed.adhoc_time = 0
        fed.adhoc_attempt = 0
        _count_import(fed, now, count)
        if q.waiters and not q.jobs:
            need_jobs(state, q, reached_zero=True)  # consumers still wait: ask now
