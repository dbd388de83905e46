"""Torn AOF tails, exhaustively: every truncation point and a flipped byte of
the last records of a real AOF.

A crash during a write leaves the file cut anywhere in its last records,
or its last blocks zeros (the size reached the disk, the data did not), or
a bit flipped by the medium.  The rules (docs/PERSISTENCE.md, "Damaged
files"): a damaged last record is dropped with a log line and everything
before it loads (``aof-load-truncated yes``, the default; ``no`` refuses);
damage followed by valid records is corruption, refused with a message
that points to ``disque-check-aof --fix``, which repairs it.  No job whose
record was complete before the tear is lost.

Every cut and every flip runs through the loader in process (hundreds of
files); a few of each kind also start a real node on the damaged file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from disque.aof import AofCorruptError, AofReader, LoadResult, Record, read_aof
from disque.aof.check import main as check_aof_main
from disque.aof.records import KIND_DELJOB, KIND_IDMP, KIND_LOADJOB
from tests.persistence.conftest import aof_file, present, start_refused
from tests.support.process import DisqueProcess

#: How many of the file's last records are torn and flipped.
LAST = 4


@pytest.fixture(scope="module")
def real_aof(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[Record]]:
    """An AOF written by a real node: jobs, an IDMP key, an ACK, and a job."""
    node = DisqueProcess(tmp_path_factory.mktemp("torn"), "--appendonly", "yes",
                         "--appendfsync", "always").start()
    try:
        r = node.client()
        ids = [r.execute_command("ADDJOB", "q", f"body-{i}", 0) for i in range(10)]
        r.execute_command("ADDJOB", "q", "once", 0, "IDMP", "key-1")
        assert r.execute_command("ACKJOB", ids[3]) == 1          # DELJOB (one node)
        r.execute_command("ADDJOB", "q", "last", 0)
    finally:
        node.kill()
    data = aof_file(node).read_bytes()
    records = [item for item in AofReader(data).scan() if isinstance(item, Record)]
    kinds = [rec.kind for rec in records[-LAST:]]
    assert {KIND_LOADJOB, KIND_DELJOB, KIND_IDMP} <= set(kinds), kinds
    assert records[-1].end == len(data)
    return data, records


def load(tmp_path: Path, data: bytes, truncated: bool = True) -> LoadResult:
    path = tmp_path / "appendonly.aof"
    path.write_bytes(data)
    return read_aof(str(path), truncated)


def state(result: LoadResult) -> tuple[dict[bytes, bytes], set[tuple[bytes, bytes]]]:
    """What a load yields: job ID -> body, and the IDMP keys."""
    return {job_id: job.body for job_id, job in result.jobs.items()}, set(result.idmp)


def test_every_truncation_point_loads_every_complete_record(
        tmp_path: Path, real_aof: tuple[bytes, list[Record]]) -> None:
    data, records = real_aof
    tail = records[-LAST:]
    boundaries = {rec.offset for rec in records} | {len(data)}
    expected_at = {rec.offset: state(load(tmp_path, data[:rec.offset])) for rec in tail}
    for cut in range(tail[0].offset, len(data)):
        torn = data[:cut]
        result = load(tmp_path, torn)
        record = next(rec for rec in tail if rec.offset <= cut < rec.end)
        if cut in boundaries:
            assert result.damage is None, cut
        else:
            assert result.damage is not None and result.damage.tail, cut
            assert result.damage.offset == record.offset, cut
            assert result.valid_size == record.offset, cut
            with pytest.raises(AofCorruptError, match="Unexpected end of the append only"):
                load(tmp_path, torn, truncated=False)
        # Every record complete before the cut is applied, nothing else.
        assert state(result) == expected_at[record.offset], cut
        # The same cut with the rest of the file zeros (its size was written,
        # its blocks were not): the same load.
        zeroed = load(tmp_path, torn + bytes(len(data) - cut))
        assert zeroed.damage is not None and zeroed.damage.tail, cut
        assert state(zeroed) == expected_at[record.offset], cut


def test_a_flipped_byte_in_the_last_records(tmp_path: Path,
                                            real_aof: tuple[bytes, list[Record]]) -> None:
    """In the last record: dropped as a torn write (or, when the flip leaves
    the job itself intact, loaded as it was).  In an earlier one: refused as
    corruption, and ``disque-check-aof --fix`` repairs the file so that
    every other record loads."""
    data, records = real_aof
    tail = records[-LAST:]
    last = tail[-1]
    whole = state(load(tmp_path, data))
    before_last = state(load(tmp_path, data[:last.offset]))
    outcomes = {"dropped": 0, "intact": 0, "refused": 0}
    for pos in range(tail[0].offset, len(data)):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        if pos >= last.offset:
            result = load(tmp_path, bytes(flipped))
            assert result.damage is not None and result.damage.tail, pos
            loaded = state(result)
            if loaded == before_last:
                outcomes["dropped"] += 1
            else:
                assert loaded == whole, pos   # never a different job or body
                outcomes["intact"] += 1
            continue
        with pytest.raises(AofCorruptError, match="Bad file format") as refused:
            load(tmp_path, bytes(flipped))
        assert "disque-check-aof --fix" in str(refused.value)
        outcomes["refused"] += 1
        path = tmp_path / "appendonly.aof"
        assert check_aof_main(["--fix", str(path)]) == 0, pos
        damaged = next(rec for rec in tail if rec.offset <= pos < rec.end)
        repaired = state(read_aof(str(path)))
        jobs, keys = repaired
        want_jobs, want_keys = whole
        # Only the damaged record is lost: its job (LOADJOB), or a deletion
        # (DELJOB: the acked job comes back, at-least-once), or a key.
        assert keys <= want_keys, pos
        lost = set(want_jobs) - set(jobs)
        back = set(jobs) - set(want_jobs)
        assert len(lost) + len(back) + len(want_keys - keys) <= 1, (pos, lost, back)
        assert all(jobs[j] == want_jobs[j] for j in set(jobs) & set(want_jobs)), pos
        assert damaged.kind in (KIND_LOADJOB, KIND_DELJOB, KIND_IDMP)
    assert outcomes["dropped"] and outcomes["refused"], outcomes


def test_a_node_starts_on_each_kind_of_torn_tail(
        server_factory, real_aof: tuple[bytes, list[Record]]) -> None:
    """A real node on a cut in the middle of each of the last records: it
    logs what it dropped, truncates the file there, and keeps appending."""
    data, records = real_aof
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    node.kill()
    path = aof_file(node)
    for record in records[-LAST:]:
        cut = (record.offset + record.end) // 2
        path.write_bytes(data[:cut])
        node.start(port=node.port)
        r = node.client()
        kept = read_aof(str(path))
        assert f"damaged record at byte offset {record.offset}" in node.log_text()
        assert path.stat().st_size == record.offset
        assert present(r, list(kept.jobs)) == set(kept.jobs)
        new = r.execute_command("ADDJOB", "q", "after the tear", 0)
        node.kill()
        node.start(port=node.port)
        assert present(node.client(), [*kept.jobs, new]) == {*kept.jobs, new}
        node.kill()


def test_a_node_refuses_a_flip_in_the_middle_then_starts_after_the_fix(
        server_factory, real_aof: tuple[bytes, list[Record]]) -> None:
    data, records = real_aof
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    node.kill()
    path = aof_file(node)
    damaged = records[-2]
    flipped = bytearray(data)
    flipped[(damaged.offset + damaged.end) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    log = start_refused(node)
    assert f"Bad file format reading the append only file {str(path)!r}" in log
    assert f"at byte offset {damaged.offset}" in log and "disque-check-aof --fix" in log
    assert check_aof_main(["--fix", str(path)]) == 0
    node.start(port=node.port)
    expected = read_aof(str(path)).jobs
    assert present(node.client(), list(expected)) == set(expected)
