"""What a link writes for the per-job messages handed to it as entries
(BusLink.send_entry): the original's messages, one per job, to a node that
does not take batches; to one of ours, runs of neighbours with the same
header as one message, everything in the order it was sent.

Sans-IO: a real bus and link object, a transport that records the bytes
(the process tests, test_batching.py and test_interop.py, run the same path
between real nodes and against the original).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from disque.cluster import messages as m
from disque.cluster.bus import HOLD_TURNS, ClusterBus
from disque.cluster.link import EARLY_WRITE_ENTRIES, BusLink
from disque.cluster.node import ClusterNode
from disque.cluster.state import ClusterState

ME = "0123456789abcdef0123456789abcdef01234567"
PEER = "fedcba9876543210fedcba9876543210fedcba98"
JOB_IDS = [b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-%04x" % i for i in range(8)]


class RecordingTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        pass


def _blob(i: int, size: int = 20) -> bytes:
    return struct.pack("<I", size) + bytes([i]) * size


def _linked(caps: int) -> tuple[ClusterState, BusLink, RecordingTransport]:
    """A bus of our node with an outbound link to PEER, recording its writes."""
    cluster = ClusterState(ClusterNode(ME, "127.0.0.1", 7711), None)
    peer = ClusterNode(PEER, "127.0.0.1", 7712)
    peer.caps = caps
    cluster.nodes[PEER] = peer
    bus = ClusterBus(cluster, lambda: 0, lambda: 15000)
    link = BusLink(bus, peer, ("127.0.0.1", 7712))
    transport = RecordingTransport()
    link.transport = transport  # type: ignore[assignment]
    peer.link = link
    return cluster, link, transport


def _run(caps: int, sends: Callable[[ClusterState, BusLink], None],
         writes: int = 1) -> tuple[list[bytes], Any]:
    """``sends`` in one event-loop turn; the frames the link wrote, in
    ``writes`` writes (one when the turn's flush is done, plus one per run
    that reached EARLY_WRITE_ENTRIES)."""
    cluster, link, transport = _linked(caps)

    async def turn() -> None:
        sends(cluster, link)
        # The bus flushes at the end of the turn, or up to HOLD_TURNS turns
        # later while new jobs' copies keep coming (none come after these).
        for _ in range(HOLD_TURNS + 2):
            await asyncio.sleep(0)

    asyncio.run(turn())
    assert len(transport.written) == writes
    return m.FrameReader().feed(b"".join(transport.written)), link.bus


def _burst(cluster: ClusterState, link: BusLink) -> None:
    """GOTJOBs, then a PING, REPLJOBs, an ENQUEUE, a NOREPLY REPLJOB, GOTJOBs."""
    for job_id in JOB_IDS[:3]:
        cluster.send_job_id(PEER, m.GOTJOB, job_id, 0)
    link.send(m.gossip_message(m.PING, ME, 7711, 4, []))
    repljob = cluster.header_key(m.REPLJOB)
    for i in range(3):
        cluster.send_entry(PEER, repljob, _blob(i))
    cluster.send_job_id(PEER, m.ENQUEUE, JOB_IDS[3], 7)
    cluster.send_entry(PEER, cluster.header_key(m.REPLJOB, m.MFLAG_NOREPLY), _blob(9))
    for job_id in JOB_IDS[4:6]:
        cluster.send_job_id(PEER, m.GOTJOB, job_id, 0)


def test_the_original_gets_one_message_per_entry_as_before() -> None:
    frames, bus = _run(0, _burst)
    expected = [
        *[m.job_id_message(m.GOTJOB, ME, 7711, 4, job_id, 0) for job_id in JOB_IDS[:3]],
        m.gossip_message(m.PING, ME, 7711, 4, []),
        *[m.jobs_message(m.REPLJOB, ME, 7711, 4, [_blob(i)]) for i in range(3)],
        m.job_id_message(m.ENQUEUE, ME, 7711, 4, JOB_IDS[3], 7),
        m.jobs_message(m.REPLJOB, ME, 7711, 4, [_blob(9)], m.MFLAG_NOREPLY),
        *[m.job_id_message(m.GOTJOB, ME, 7711, 4, job_id, 0) for job_id in JOB_IDS[4:6]],
    ]
    assert frames == expected  # byte for byte
    assert bus.stats_sent == len(expected) and bus.stats_merged == 0


def test_our_nodes_get_runs_of_neighbours_merged_in_order() -> None:
    frames, bus = _run(m.CAP_BATCH, _burst)
    decoded = [m.decode(frame) for frame in frames]
    assert [(msg.type, msg.numjobs, msg.mflags) for msg in decoded] == [
        (m.GOTJOB, 3, 0), (m.PING, 0, 0), (m.REPLJOB, 3, 0), (m.ENQUEUE, 0, 0),
        (m.REPLJOB, 1, m.MFLAG_NOREPLY), (m.GOTJOB, 2, 0)]
    assert [e.job_id for e in m.split_job_ids(decoded[0])] == JOB_IDS[:3]
    assert decoded[2].payload == b"".join(_blob(i) for i in range(3))
    assert decoded[3].job_id == JOB_IDS[3] and decoded[3].aux == 7
    assert decoded[4].payload == _blob(9)
    assert [e.job_id for e in m.split_job_ids(decoded[5])] == JOB_IDS[4:6]
    # A merged message has the header the single ones would have had.
    assert frames[0][16:144] == m.job_id_message(m.GOTJOB, ME, 7711, 4, JOB_IDS[0], 0)[16:144]
    assert bus.stats_sent == 11 and bus.stats_merged == 11 - len(frames)


def test_a_large_job_travels_alone_and_batches_are_bounded() -> None:
    big = _blob(1, m.MAX_BATCHED_ENTRY + 1)

    def sends(cluster: ClusterState, link: BusLink) -> None:
        key = cluster.header_key(m.REPLJOB)
        cluster.send_entry(PEER, key, _blob(0))
        cluster.send_entry(PEER, key, big)
        cluster.send_entry(PEER, key, _blob(2))
        for _ in range(EARLY_WRITE_ENTRIES + 1):
            cluster.send_job_id(PEER, m.DELJOB, JOB_IDS[0], 0)

    # The run of DELJOBs reached EARLY_WRITE_ENTRIES: written at once, with
    # everything before it; the last DELJOB at the end of the turn.
    frames, _bus = _run(m.CAP_BATCH, sends, writes=2)
    decoded = [m.decode(frame) for frame in frames]
    assert [(msg.type, msg.numjobs) for msg in decoded] == [
        (m.REPLJOB, 1), (m.REPLJOB, 1), (m.REPLJOB, 1), (m.DELJOB, EARLY_WRITE_ENTRIES),
        (m.DELJOB, 0)]
    assert frames[1] == m.jobs_message(m.REPLJOB, ME, 7711, 4, [big])
    assert all(len(frame) <= m.SMALL_MESSAGE for frame in frames)
    assert EARLY_WRITE_ENTRIES <= m.MAX_BATCH


def test_a_long_run_is_written_before_the_turn_ends() -> None:
    """A pipelined burst: every EARLY_WRITE_ENTRIES entries of a run leave
    at once (the peer starts on them while this node parses the rest), in
    order, persistence hooks first; the remainder at the end of the turn."""
    written_during_turn: list[int] = []
    hooks: list[int] = []

    def sends(cluster: ClusterState, link: BusLink) -> None:
        transport = link.transport
        assert isinstance(transport, RecordingTransport)
        link.bus.before_flush.append(lambda: hooks.append(len(transport.written)))
        key = cluster.header_key(m.REPLJOB)
        for i in range(2 * EARLY_WRITE_ENTRIES + 5):
            cluster.send_entry(PEER, key, _blob(i % 256))
        written_during_turn.append(len(transport.written))

    frames, bus = _run(m.CAP_BATCH, sends, writes=3)
    assert written_during_turn == [2]
    assert hooks == [0, 1, 2]  # before each write
    decoded = [m.decode(frame) for frame in frames]
    assert [msg.numjobs for msg in decoded] == [EARLY_WRITE_ENTRIES, EARLY_WRITE_ENTRIES, 5]
    blobs = b"".join(msg.payload for msg in decoded)
    assert blobs == b"".join(_blob(i % 256) for i in range(2 * EARLY_WRITE_ENTRIES + 5))
    assert bus.stats_sent == 2 * EARLY_WRITE_ENTRIES + 5


def test_a_link_to_the_original_starts_no_early_write() -> None:
    """Runs are only for our nodes: alone, the original's single messages
    leave in one write at the end of the turn, however many."""
    def sends(cluster: ClusterState, link: BusLink) -> None:
        for _ in range(2 * EARLY_WRITE_ENTRIES):
            cluster.send_job_id(PEER, m.GOTJOB, JOB_IDS[0], 0)

    frames, _bus = _run(0, sends, writes=1)
    assert len(frames) == 2 * EARLY_WRITE_ENTRIES


def test_the_header_follows_our_flags() -> None:
    def sends(cluster: ClusterState, link: BusLink) -> None:
        cluster.send_job_id(PEER, m.QUEUED, JOB_IDS[0], 0)
        cluster.set_leaving(True)
        cluster.send_job_id(PEER, m.QUEUED, JOB_IDS[1], 0)

    frames, _bus = _run(m.CAP_BATCH, sends)
    assert [m.decode(frame).flags for frame in frames] == [4, 4 | 128]


# -- new jobs' copies wait for the next turns (ClusterBus.flush) ------------------

def _writes_per_turn(turns: list[Callable[[ClusterState], None]],
                     caps: int = m.CAP_BATCH) -> tuple[list[int], list[bytes]]:
    """``turns[i]`` runs in event-loop turn i (then empty turns); the number
    of writes the link made by the end of each turn, and its frames."""
    cluster, _link, transport = _linked(caps)
    seen: list[int] = []

    async def run() -> None:
        for sends in [*turns, *[lambda _cluster: None] * (HOLD_TURNS + 2)]:
            sends(cluster)
            await asyncio.sleep(0)  # the flush (or its hold) runs, then us
            seen.append(len(transport.written))

    asyncio.run(run())
    return seen, m.FrameReader().feed(b"".join(transport.written))


def _copies(first: int, count: int) -> Callable[[ClusterState], None]:
    def sends(cluster: ClusterState) -> None:
        key = cluster.header_key(m.REPLJOB)
        for i in range(first, first + count):
            cluster.send_entry(PEER, key, _blob(i))
    return sends


def test_new_jobs_copies_wait_while_each_turn_brings_more() -> None:
    """Unpipelined clients: every turn reads a few more ADDJOBs.  Their
    REPLJOB waits HOLD_TURNS turns at most, then leaves as one message with
    every copy of those turns, in order; the turns after it start anew."""
    assert HOLD_TURNS >= 1
    turns = [_copies(3 * i, 3) for i in range(HOLD_TURNS + 2)]
    seen, frames = _writes_per_turn(turns)
    assert seen[:HOLD_TURNS + 1] == [0] * HOLD_TURNS + [1]
    decoded = [m.decode(frame) for frame in frames]
    assert decoded[0].numjobs == 3 * (HOLD_TURNS + 1)
    assert b"".join(msg.payload for msg in decoded) == b"".join(
        _blob(i) for i in range(3 * len(turns)))
    # The last turn's copies start a hold of their own, which the empty
    # turn after them ends.
    assert seen == [0] * HOLD_TURNS + [1, 1, 2] + [2] * (HOLD_TURNS + 1)


def test_a_lone_jobs_copies_wait_one_turn_only() -> None:
    """One client's ADDJOB: the next turn brings no more copies, so the
    REPLJOB leaves then (one non-blocking poll later), never on a timer."""
    seen, frames = _writes_per_turn([_copies(0, 1)])
    assert seen[:2] == [0, 1]
    assert [m.decode(frame).numjobs for frame in frames] == [1]


def test_other_messages_leave_at_the_end_of_their_turn() -> None:
    """GOTJOBs (a peer confirming copies) and other job messages are not
    held: the creator's client waits on them."""
    def sends(cluster: ClusterState) -> None:
        for job_id in JOB_IDS[:3]:
            cluster.send_job_id(PEER, m.GOTJOB, job_id, 0)
        cluster.send_job_id(PEER, m.QUEUED, JOB_IDS[3], 0)

    seen, frames = _writes_per_turn([sends])
    assert seen[0] == 1
    assert [(m.decode(f).type, m.decode(f).numjobs) for f in frames] == [
        (m.GOTJOB, 3), (m.QUEUED, 0)]


def test_copies_to_the_original_are_not_held() -> None:
    """A link to the original takes one REPLJOB per job, so holding them
    would batch nothing: they leave at the end of the turn."""
    seen, frames = _writes_per_turn([_copies(0, 2), _copies(2, 2)], caps=0)
    assert seen[:2] == [1, 2]
    assert len(frames) == 4


def test_a_pipelined_burst_is_not_held() -> None:
    """A turn whose copies filled a run (EARLY_WRITE_ENTRIES, written at once)
    is a pipelined burst: its remainder leaves at the end of the turn."""
    seen, frames = _writes_per_turn([_copies(0, EARLY_WRITE_ENTRIES + 3)])
    assert seen[0] == 2
    assert [m.decode(frame).numjobs for frame in frames] == [EARLY_WRITE_ENTRIES, 3]


def test_copies_sent_beside_other_messages_are_not_held() -> None:
    """Only a link with nothing but copies to send waits: a GOTJOB (this
    node confirms another one's jobs while making its own) goes at the end
    of the turn, with the copies queued after it."""
    def sends(cluster: ClusterState) -> None:
        cluster.send_job_id(PEER, m.GOTJOB, JOB_IDS[0], 0)
        _copies(0, 2)(cluster)

    seen, frames = _writes_per_turn([sends])
    assert seen[0] == 1
    assert [(m.decode(f).type, m.decode(f).numjobs) for f in frames] == [
        (m.GOTJOB, 0), (m.REPLJOB, 2)]


def test_after_a_burst_copies_are_held_again() -> None:
    """The burst rule lasts one turn: unpipelined copies after a pipelined
    burst wait as before."""
    seen, frames = _writes_per_turn([_copies(0, EARLY_WRITE_ENTRIES + 3), lambda c: None,
                                     _copies(100, 2)])
    assert seen[:4] == [2, 2, 2, 3]
    assert [m.decode(frame).numjobs for frame in frames] == [EARLY_WRITE_ENTRIES, 3, 2]


def test_stopping_writes_what_a_hold_kept() -> None:
    """A node stopping while copies wait writes them before closing its links."""
    cluster, link, transport = _linked(m.CAP_BATCH)

    async def run() -> None:
        _copies(0, 2)(cluster)
        await asyncio.sleep(0)  # the end-of-turn flush holds them
        assert transport.written == []
        link.bus.stop()
        await asyncio.sleep(0)  # the held flush runs after stop: a no-op

    asyncio.run(run())
    assert link.closed
    assert [m.decode(frame).numjobs for frame in m.FrameReader().feed(
        b"".join(transport.written))] == [2]
