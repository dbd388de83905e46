"""The bus codec against the original's byte layouts (offsets written out
from the original's cluster.h and checked on the wire against 1.0-rc1)."""

from __future__ import annotations

import struct

import pytest

from disque.cluster import messages as m

SENDER = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
JOB_ID = b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


def test_header_layout() -> None:
    frame = m.job_id_message(m.SETACK, SENDER, 7711, m.flags_to_wire({"myself", "leaving"}),
                             JOB_ID, 3, mflags=m.MFLAG_NOREPLY)
    assert len(frame) == 188
    assert frame[0:4] == b"DbuZ"
    assert struct.unpack(">I", frame[4:8])[0] == 188          # totlen, whole message
    assert struct.unpack(">H", frame[8:10])[0] == 1            # version
    assert struct.unpack(">H", frame[12:14])[0] == 8           # type SETACK
    assert struct.unpack(">H", frame[14:16])[0] == 0           # gossip count
    assert frame[16:56] == SENDER.encode()
    assert frame[56:136] == bytes(80)                          # myip + reserved
    assert struct.unpack(">H", frame[136:138])[0] == 7711      # client port
    assert struct.unpack(">H", frame[138:140])[0] == 4 | 128   # MYSELF | LEAVING
    # mflags[0] NOREPLY; mflags[1] CAP_BATCH (ours: the original sends 0, reads nothing)
    assert frame[140] == 0 and frame[141:144] == b"\x01\x01\x00"
    assert frame[144:184] == JOB_ID and struct.unpack(">I", frame[184:188])[0] == 3


def test_node_flag_bits_are_the_originals() -> None:
    assert m.WIRE_FLAGS == {"fail?": 1, "fail": 2, "myself": 4, "handshake": 8,
                            "noaddr": 16, "meet": 32, "deleted": 64, "leaving": 128}
    assert m.flags_from_wire(1 | 128) == {"fail?", "leaving"}
    assert m.flags_to_wire(["fail", "noaddr"]) == 2 | 16


def test_gossip_entry_layout_and_round_trip() -> None:
    entry = m.GossipEntry(OTHER, 1795465217438, 0, "127.0.0.2", 7712, 1)
    frame = m.gossip_message(m.PING, SENDER, 7711, 4, [entry, entry._replace(node_id=SENDER)])
    assert len(frame) == 144 + 2 * 104
    assert struct.unpack(">H", frame[14:16])[0] == 2
    g = frame[144:248]
    assert g[0:40] == OTHER.encode()
    assert struct.unpack(">I", g[40:44])[0] == 1795465217438 & 0xFFFFFFFF  # low 32 bits of ms
    assert struct.unpack(">I", g[44:48])[0] == 0
    assert g[48:94] == b"127.0.0.2".ljust(46, b"\0")
    assert struct.unpack(">HH", g[94:98]) == (7712, 1)
    assert g[98:104] == bytes(6)
    msg = m.decode(frame)
    assert msg is not None and msg.type == m.PING and msg.sender == SENDER and msg.port == 7711
    assert msg.gossip[0] == entry._replace(ping_sent=1795465217438 & 0xFFFFFFFF)


@pytest.mark.parametrize("frame, fields", [
    (m.fail_message(SENDER, 1, 0, OTHER), {"type": m.FAIL, "node_id": OTHER}),
    (m.queue_message(m.PAUSE, SENDER, 1, 0, b"myqueue", 3),
     {"type": m.PAUSE, "queue": b"myqueue", "aux": 3}),
    (m.jobs_message(m.REPLJOB, SENDER, 1, 0, [b"blob1", b"blob22"]),
     {"type": m.REPLJOB, "numjobs": 2, "payload": b"blob1blob22"}),
    (m.qlimit_message(SENDER, 1, 0, b"api", 50, 1000),
     {"type": m.QLIMIT, "queue": b"api", "aux": 50, "period": 1000}),
])
def test_bodies_round_trip(frame: bytes, fields: dict) -> None:
    msg = m.decode(frame)
    assert msg is not None
    for name, value in fields.items():
        assert getattr(msg, name) == value


def test_body_lengths_follow_the_original() -> None:
    assert len(m.fail_message(SENDER, 1, 0, OTHER)) == 184
    assert len(m.queue_message(m.NEEDJOBS, SENDER, 1, 0, b"q" * 10, 5)) == 152 + 10
    assert len(m.jobs_message(m.YOURJOBS, SENDER, 1, 0, [b"x" * 30])) == 152 + 30


def _with_totlen(frame: bytes, totlen: int) -> bytes:
    return frame[:4] + struct.pack(">I", totlen) + frame[8:]


def test_wrong_lengths_for_the_type_are_dropped() -> None:
    ping = m.gossip_message(m.PING, SENDER, 1, 0, [])
    # count says one gossip entry, none follows
    assert m.decode(ping[:14] + struct.pack(">H", 1) + ping[16:]) is None
    fail = m.fail_message(SENDER, 1, 0, OTHER)
    assert m.decode(_with_totlen(fail + b"x", 185) + b"") is None  # one byte too many
    job = m.job_id_message(m.GOTJOB, SENDER, 1, 0, JOB_ID, 0)
    assert m.decode(job[:-1]) is None
    queue = m.queue_message(m.PAUSE, SENDER, 1, 0, b"abc", 1)
    assert m.decode(queue + b"d") is None                      # name length says 3
    jobs = m.jobs_message(m.REPLJOB, SENDER, 1, 0, [b"abc"])
    assert m.decode(jobs[:-1]) is None
    qlimit = m.qlimit_message(SENDER, 1, 0, b"abc", 5, 100)
    assert m.decode(_with_totlen(qlimit[:-1], len(qlimit) - 1)) is None  # no whole period
    assert m.decode(ping[:8] + struct.pack(">H", 2) + ping[10:]) is None  # version 2
    assert m.decode(ping[:12] + struct.pack(">H", 99) + ping[14:]) is None  # unknown type


def test_reader_splits_a_stream_in_any_chunks() -> None:
    frames = [m.gossip_message(m.PING, SENDER, 1, 0, []),
              m.job_id_message(m.QUEUED, SENDER, 1, 0, JOB_ID, 0),
              m.queue_message(m.NEEDJOBS, SENDER, 1, 0, b"q", 5)]
    stream = b"".join(frames) * 3
    reader = m.FrameReader()
    assert reader.feed(stream) == frames * 3                   # many messages per read
    got: list[bytes] = []
    for i in range(len(stream)):                                # one byte per read
        got += reader.feed(stream[i:i + 1])
    assert got == frames * 3 and reader.pending == 0


@pytest.mark.parametrize("data, error", [
    (b"GET / HTTP/1.1\r\n\r\n", "bad signature"),
    (b"DbuZ" + struct.pack(">I", 143), "below the header size"),
    (b"DbuZ" + struct.pack(">I", 0), "below the header size"),
    (b"DbuZ" + struct.pack(">I", 0xFFFFFFFF), "over the limit"),
])
def test_reader_refuses_what_is_not_the_protocol(data: bytes, error: str) -> None:
    with pytest.raises(m.FrameError, match=error):
        m.FrameReader(max_message=1 << 20).feed(data)


def test_reader_refuses_an_oversized_message_before_its_body() -> None:
    reader = m.FrameReader(max_message=1000)
    with pytest.raises(m.FrameError):
        reader.feed(b"DbuZ" + struct.pack(">I", 1001))        # only 8 bytes were needed


def test_truncated_message_waits_for_the_rest() -> None:
    frame = m.job_id_message(m.DELJOB, SENDER, 1, 0, JOB_ID, 0)
    reader = m.FrameReader()
    assert reader.feed(frame[:100]) == [] and reader.pending == 100
    assert reader.feed(frame[100:]) == [frame]


def test_large_messages_need_the_readers_consent() -> None:
    big = m.jobs_message(m.REPLJOB, SENDER, 1, 0, [b"x" * (m.SMALL_MESSAGE + 10)])
    seen: list[bytes] = []

    def known_sender(header: bytes) -> bool:
        seen.append(header)
        return header[16:56] == SENDER.encode()

    reader = m.FrameReader(large_ok=known_sender)
    assert reader.feed(big[:100]) == [] and not seen  # waits for the whole header
    assert reader.feed(big[100:]) == [big] and seen[0] == big[:144]
    stranger = m.jobs_message(m.REPLJOB, "f" * 40, 1, 0, [b"x" * (m.SMALL_MESSAGE + 10)])
    with pytest.raises(m.FrameError, match="only allowed for jobs from known nodes"):
        m.FrameReader(large_ok=known_sender).feed(stranger[:144])
    small = m.jobs_message(m.REPLJOB, "f" * 40, 1, 0, [b"x" * 10])
    assert m.FrameReader(large_ok=known_sender).feed(small) == [small]


def test_senders_and_gossip_ids_must_be_node_ids() -> None:
    for bad in ("ZZ zz\n" + "a" * 34, "A" * 40, "a" * 39 + "\0"):
        frame = m.job_id_message(m.GOTJOB, "a" * 40, 1, 0, JOB_ID, 0)
        frame = frame[:16] + bad.encode() + frame[56:]
        assert m.decode(frame) is None, bad
    assert m.is_node_id(SENDER) and not m.is_node_id(SENDER.upper())


# -- batching between our nodes (CAP_BATCH) ------------------------------------

def _ids(n: int) -> list[bytes]:
    return [JOB_ID[:-4] + b"%04x" % i for i in range(n)]


def test_neighbouring_job_id_messages_merge_into_one_with_a_count() -> None:
    frames = [m.job_id_message(m.GOTJOB, SENDER, 7711, 4, job_id, i)
              for i, job_id in enumerate(_ids(3))]
    (merged,) = m.coalesce(frames)
    assert len(merged) == 144 + 3 * 44
    assert struct.unpack(">I", merged[4:8])[0] == len(merged)
    assert struct.unpack(">H", merged[14:16])[0] == 3          # count: the entries
    assert merged[16:144] == frames[0][16:144]                 # the same header otherwise
    msg = m.decode(merged)
    assert msg is not None and msg.type == m.GOTJOB and msg.numjobs == 3
    assert msg.caps == m.CAP_BATCH
    entries = m.split_job_ids(msg)
    assert [(e.job_id, e.aux, e.sender, e.type) for e in entries] == [
        (job_id, i, SENDER, m.GOTJOB) for i, job_id in enumerate(_ids(3))]


def test_only_neighbours_with_the_same_header_merge_and_order_is_kept() -> None:
    a, b, c, d = _ids(4)
    got = [m.job_id_message(m.GOTJOB, SENDER, 1, 4, job_id, 0) for job_id in (a, b)]
    queued = m.job_id_message(m.QUEUED, SENDER, 1, 4, c, 0)
    nacked = m.job_id_message(m.QUEUED, SENDER, 1, 4, d, 0, mflags=m.MFLAG_INCR_NACKS)
    ping = m.gossip_message(m.PING, SENDER, 1, 4, [])
    last = m.job_id_message(m.GOTJOB, SENDER, 1, 4, d, 0)
    out = m.coalesce([*got, queued, nacked, ping, last])
    decoded = [m.decode(frame) for frame in out]
    assert [(msg.type, msg.numjobs, msg.mflags) for msg in decoded] == [
        (m.GOTJOB, 2, 0), (m.QUEUED, 0, 0), (m.QUEUED, 0, m.MFLAG_INCR_NACKS), (m.PING, 0, 0),
        (m.GOTJOB, 0, 0)]
    assert out[1] is queued and out[3] is ping  # alone: sent as they were


def test_single_job_repljobs_merge_into_one_repljob() -> None:
    blobs = [struct.pack("<I", 5) + b"job-%d" % i for i in range(3)]
    frames = [m.jobs_message(m.REPLJOB, SENDER, 1, 4, [blob]) for blob in blobs]
    noreply = m.jobs_message(m.REPLJOB, SENDER, 1, 4, [blobs[0]], m.MFLAG_NOREPLY)
    with_trailer = m.jobs_message(m.REPLJOB, SENDER, 1, 4, [blobs[1]], trailer=b"DQXT...")
    out = m.coalesce([*frames, noreply, with_trailer])
    assert len(out) == 3
    msg = m.decode(out[0])
    assert msg is not None and msg.type == m.REPLJOB and msg.numjobs == 3
    assert msg.payload == b"".join(blobs)
    assert out[1] is noreply and out[2] is with_trailer  # a trailer describes its own jobs


def test_batches_are_bounded() -> None:
    frames = [m.job_id_message(m.DELJOB, SENDER, 1, 4, JOB_ID, 0)] * (m.MAX_BATCH + 1)
    out = m.coalesce(frames)
    assert [m.decode(frame).numjobs for frame in out] == [m.MAX_BATCH, 0]
    big = [m.jobs_message(m.REPLJOB, SENDER, 1, 4, [struct.pack("<I", 40_000) + bytes(40_000)])
           for _ in range(10)]
    assert all(len(frame) <= 1024 * 1024 for frame in m.coalesce(big))
    assert len(m.coalesce(big)) > 1


def test_a_batched_message_with_the_wrong_length_is_dropped() -> None:
    (merged,) = m.coalesce([m.job_id_message(m.GOTJOB, SENDER, 1, 4, j, 0) for j in _ids(3)])
    assert m.decode(merged[:-44]) is None  # count 3, two entries
    # The original's job-ID messages (count 0) are unchanged.
    assert m.decode(m.job_id_message(m.GOTJOB, SENDER, 1, 4, JOB_ID, 0)).numjobs == 0
