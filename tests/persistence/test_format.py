"""The AOF record format and reader, without processes."""

from __future__ import annotations

import zlib

import pytest

from disque.aof import (
    AofCorruptError,
    AofReader,
    BlobDecoder,
    Damage,
    Record,
    dehydrated_ack_record,
    deljob_record,
    loadjob_record,
    mark_record,
    read_aof,
)
from disque.job import (
    FLAG_BCAST_QUEUED,
    FLAG_DELIVERED,
    Job,
    JobIdGenerator,
    JobState,
    SerializationError,
    deserialize_job,
    serialize_job,
)

NODE_A = "a" * 40
NODE_B = "b" * 40
IDS = JobIdGenerator(NODE_A)


def make_job(**kw) -> Job:
    retry = kw.pop("retry", 30)
    job = Job(IDS.next_id(3600, retry), kw.pop("queue", b"q"), kw.pop("body", b"hello"),
              state=kw.pop("state", JobState.QUEUED), repl=kw.pop("repl", 1),
              ctime=kw.pop("ctime", 1_700_000_000_000_000_001),
              etime=kw.pop("etime", 1_700_000_360_000), delay=kw.pop("delay", 0), retry=retry,
              delivered=kw.pop("delivered", frozenset([NODE_A])))
    for name, value in kw.items():
        setattr(job, name, value)
    return job


def same_job(a: Job, b: Job) -> bool:
    fields = ("id", "queue", "body", "state", "flags", "repl", "ctime", "etime", "delay",
              "retry", "nacks", "additional_deliveries", "gc_retry", "delivered")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


@pytest.mark.parametrize("job", [
    make_job(),
    make_job(state=JobState.ACTIVE, flags=FLAG_BCAST_QUEUED | FLAG_DELIVERED, nacks=3,
             additional_deliveries=2),
    make_job(retry=0, body=b"", queue=b"q" * 300),
    make_job(state=JobState.ACKED, gc_retry=5, delivered=frozenset([NODE_A, NODE_B])),
    make_job(body=bytes(range(256)) * 100, delay=10),
    make_job(delivered=frozenset()),
])
def test_fast_decoder_matches_deserialize_job(job: Job) -> None:
    blob = serialize_job(job)
    reference, end = deserialize_job(blob)
    assert end == len(blob)
    for checked in (True, False):
        assert same_job(BlobDecoder().decode(blob, checked), reference)


def test_blobs_round_trip_and_damaged_ones_are_refused() -> None:
    """serialize_job packs with one struct per queue-name length and
    deserialize_job reads lengths byte by byte: any queue length round
    trips, and a cut or a wrong length field gives SerializationError,
    never another exception or a job read from the next blob's bytes."""
    for qlen in (1, 7, 255, 256, 70_000):
        job = make_job(queue=b"q" * qlen, body=b"b" * (qlen % 97))
        blob = serialize_job(job)
        copy, end = deserialize_job(blob + b"next blob")
        assert end == len(blob) and same_job(copy, job)
    blob = serialize_job(make_job(queue=b"queue", body=b"body",
                                  delivered=frozenset([NODE_A, NODE_B])))
    for cut in range(len(blob)):
        with pytest.raises(SerializationError):
            deserialize_job(blob[:cut])
    qlen_at, blen_at = 72, 76 + 5
    for at, value in ((0, 10), (0, len(blob)), (qlen_at, 1000), (blen_at, 1000),
                      (blen_at, 3), (blen_at + 4 + 4, 1)):
        bad = blob[:at] + value.to_bytes(4, "little") + blob[at + 4:]
        with pytest.raises(SerializationError):
            deserialize_job(bad + serialize_job(make_job()))


def test_records_parse_back() -> None:
    job = make_job()
    data = loadjob_record(job) + deljob_record(job.id) + mark_record(b"shutdown 1")
    items = list(AofReader(data).scan())
    assert [type(i) for i in items] == [Record, Record, Record]
    assert all(i.checked for i in items)
    assert items[0].args == [serialize_job(job)]
    assert items[1].args == [job.id]
    assert items[2].args == [b"shutdown 1"]
    assert items[2].end == len(data)


def test_checksum_covers_the_record() -> None:
    rec = loadjob_record(make_job())
    crc = int(rec[-10:-2], 16)
    assert zlib.crc32(rec[:rec.rindex(b"$8\r\n")]) == crc


def test_dehydrated_ack_has_no_body() -> None:
    job = make_job(state=JobState.ACKED, body=b"x" * 1000)
    rec = dehydrated_ack_record(job)
    loaded = BlobDecoder().decode(next(AofReader(rec).scan()).args[0])
    assert loaded.body == b"" and loaded.state == JobState.ACKED and loaded.id == job.id
    assert len(rec) < 300


def test_original_format_loads(tmp_path) -> None:
    """Records of the C server: *2 LOADJOB <blob>, DELJOB with several IDs, no checksum."""
    jobs = [make_job() for _ in range(3)]

    def cmd(*args: bytes) -> bytes:
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)

    data = b"".join(cmd(b"LOADJOB", serialize_job(j)) for j in jobs)
    data += cmd(b"DELJOB", jobs[0].id, jobs[1].id)
    path = tmp_path / "legacy.aof"
    path.write_bytes(data)
    result = read_aof(str(path))
    assert list(result.jobs) == [jobs[2].id]
    assert result.legacy_only and result.damage is None


def test_last_loadjob_wins_and_deljob_of_unknown_is_ignored(tmp_path) -> None:
    job = make_job()
    later = make_job()
    later.id = job.id
    later.nacks = 7
    path = tmp_path / "a.aof"
    path.write_bytes(deljob_record(job.id) + loadjob_record(job) + loadjob_record(later))
    assert read_aof(str(path)).jobs[job.id].nacks == 7


def records(n: int) -> tuple[bytes, list[int]]:
    parts = [loadjob_record(make_job()) for _ in range(n)]
    offsets = []
    pos = 0
    for p in parts:
        offsets.append(pos)
        pos += len(p)
    return b"".join(parts), offsets


@pytest.mark.parametrize("cut", [1, 10, 40, 100, 150])
def test_truncated_tail_is_a_tail(tmp_path, cut: int) -> None:
    data, offsets = records(5)
    path = tmp_path / "t.aof"
    path.write_bytes(data[:offsets[4] + cut])
    result = read_aof(str(path))
    assert len(result.jobs) == 4
    assert result.damage is not None and result.damage.tail
    assert result.damage.offset == offsets[4] == result.valid_size
    with pytest.raises(AofCorruptError, match=f"byte offset {offsets[4]}"):
        read_aof(str(path), load_truncated=False)


def test_zero_filled_tail(tmp_path) -> None:
    data, _ = records(3)
    path = tmp_path / "z.aof"
    path.write_bytes(data + b"\0" * 4096)
    result = read_aof(str(path))
    assert len(result.jobs) == 3 and result.damage.tail and "zero bytes" in result.damage.reason


@pytest.mark.parametrize("where", ["body", "header", "length"])
def test_corruption_in_the_middle_names_the_offset(tmp_path, where: str) -> None:
    data, offsets = records(6)
    buf = bytearray(data)
    rec = offsets[2]
    if where == "body":
        buf[rec + 100] ^= 0x55          # inside the blob: only the checksum sees it
    elif where == "header":
        buf[rec] = ord("X")
    else:
        buf[rec + 18] = ord("9")        # the blob length
    path = tmp_path / "c.aof"
    path.write_bytes(bytes(buf))
    with pytest.raises(AofCorruptError, match=f"byte offset {rec}:"):
        read_aof(str(path))
    damages = [i for i in AofReader(bytes(buf)).scan() if isinstance(i, Damage)]
    assert len(damages) == 1 and not damages[0].tail
    assert damages[0].offset == rec and damages[0].end == offsets[3]


def test_bad_checksum_on_the_last_record_is_a_torn_tail(tmp_path) -> None:
    data, offsets = records(3)
    buf = bytearray(data)
    buf[offsets[2] + 90] ^= 0xFF
    path = tmp_path / "l.aof"
    path.write_bytes(bytes(buf))
    result = read_aof(str(path))
    assert len(result.jobs) == 2 and result.damage.tail


def test_clean_shutdown_mark_must_be_last(tmp_path) -> None:
    job = make_job()
    path = tmp_path / "m.aof"
    path.write_bytes(loadjob_record(job) + mark_record(b"shutdown 1"))
    assert read_aof(str(path)).clean_shutdown
    path.write_bytes(loadjob_record(job) + mark_record(b"shutdown 1") + deljob_record(job.id))
    assert not read_aof(str(path)).clean_shutdown
