"""Damaged files: a torn last record is dropped, corruption refuses to start, repair tool."""

from __future__ import annotations

import subprocess
import sys

from disque.aof import AofReader, Record
from tests.persistence.conftest import aof_file, present, start_refused


def make_aof(server_factory, jobs: int = 20):
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    r = node.client()
    ids = [r.execute_command("ADDJOB", "q", f"body-{i}" * 10, 0) for i in range(jobs)]
    node.stop()
    data = aof_file(node).read_bytes()
    offsets = [item.offset for item in AofReader(data).scan() if isinstance(item, Record)]
    assert len(offsets) == jobs
    return node, ids, data, offsets


def check_aof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disque.aof.check", *args],
                          capture_output=True, text=True, timeout=60)


def test_truncated_last_record_is_dropped_and_logged(server_factory) -> None:
    node, ids, data, offsets = make_aof(server_factory)
    path = aof_file(node)
    path.write_bytes(data[:offsets[-1] + 80])          # a crash in the middle of a write
    node.start()
    log = node.log_text()
    assert f"damaged record at byte offset {offsets[-1]}" in log
    assert f"a LOADJOB record for job {ids[-1].decode()}" in log
    assert path.stat().st_size == offsets[-1]          # the torn bytes are gone
    r = node.client()
    assert present(r, ids) == set(ids[:-1])
    # And the file keeps working: new records follow the good ones.
    new = r.execute_command("ADDJOB", "q", "after", 0)
    node.kill()
    node.start()
    assert present(node.client(), [*ids, new]) == {*ids[:-1], new}


def test_truncated_file_refused_with_aof_load_truncated_no(server_factory) -> None:
    node, _ids, data, offsets = make_aof(server_factory)
    aof_file(node).write_bytes(data[:-5])
    log = start_refused(node, "--aof-load-truncated", "no")
    assert "Unexpected end of the append only file" in log
    assert f"byte offset {offsets[-1]}" in log


def test_corruption_in_the_middle_refuses_to_start_then_repair(server_factory) -> None:
    node, ids, data, offsets = make_aof(server_factory)
    path = aof_file(node)
    damaged = bytearray(data)
    damaged[offsets[7] + 120] ^= 0x20                  # inside job 7's body
    path.write_bytes(bytes(damaged))
    log = start_refused(node)
    assert f"at byte offset {offsets[7]}: checksum mismatch" in log
    assert "disque-check-aof --fix" in log

    report = check_aof(str(path))
    assert report.returncode == 1
    assert f"corrupted region: bytes {offsets[7]}..{offsets[8]}" in report.stdout
    assert f"job {ids[7].decode()}" in report.stdout

    fixed = check_aof("--fix", str(path))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "Successfully repaired" in fixed.stdout
    assert (path.parent / "appendonly.aof.bak").read_bytes() == bytes(damaged)
    assert check_aof(str(path)).returncode == 0
    node.start()
    assert present(node.client(), ids) == set(ids) - {ids[7]}


def test_check_tool_on_a_sound_file(server_factory) -> None:
    node, _ids, _data, _offsets = make_aof(server_factory, jobs=5)
    result = check_aof(str(aof_file(node)))
    assert result.returncode == 0
    assert "5 LOADJOB" in result.stdout and "AOF is valid" in result.stdout


def test_aof_that_is_a_directory_refuses_to_start(server_factory, tmp_path) -> None:
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    node.kill()
    aof_file(node).unlink(missing_ok=True)
    aof_file(node).mkdir()
    assert "it is a directory" in start_refused(node)
