"""Idempotent ADDJOB (extension): ``ADDJOB ... IDMP key [IDMP-WINDOW s]`` on a real node."""

from __future__ import annotations

import pytest
import redis

from disque.job_table import JOB_OVERHEAD_BYTES
from tests.support.process import DisqueProcess, wait_for


def ext_info(r: redis.Redis) -> dict:
    return r.info("extensions")


def test_retry_with_same_key_returns_first_id_and_adds_nothing(r: redis.Redis) -> None:
    first = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "order-1")
    again = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "order-1")
    assert again == first
    assert r.execute_command("QLEN", "q") == 1
    assert r.info("jobs")["registered_jobs"] == 1
    info = ext_info(r)
    assert info["idmp_keys"] == 1 and info["idmp_hits"] == 1
    # Other options may differ on the retry (only the body is compared).
    assert r.execute_command("ADDJOB", "q", "body", 5000, "IDMP", "order-1", "TTL", 60,
                             "DELAY", 1, "RETRY", 2) == first
    assert r.execute_command("QLEN", "q") == 1


def test_keys_are_scoped_per_queue(r: redis.Redis) -> None:
    a = r.execute_command("ADDJOB", "qa", "body", 0, "IDMP", "k")
    b = r.execute_command("ADDJOB", "qb", "body", 0, "IDMP", "k")
    assert a != b
    assert r.execute_command("QLEN", "qa") == 1 == r.execute_command("QLEN", "qb")


def test_key_reused_with_different_body_is_refused_and_first_job_kept(r: redis.Redis) -> None:
    first = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k")
    with pytest.raises(redis.ResponseError) as err:
        r.execute_command("ADDJOB", "q", "other body", 0, "IDMP", "k")
    text = str(err.value)
    assert text.startswith("IDMPCONFLICT") and first.decode() in text
    assert r.execute_command("QLEN", "q") == 1
    assert r.execute_command("QPEEK", "q", 1)[0][2] == b"body"
    assert ext_info(r)["idmp_conflicts"] == 1
    # The key still names the first job.
    assert r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k") == first


def test_retry_after_ack_or_delete_still_returns_first_id(r: redis.Redis) -> None:
    first = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k")
    job = r.execute_command("GETJOB", "FROM", "q")[0]
    assert r.execute_command("ACKJOB", job[1]) == 1
    assert r.execute_command("SHOW", first) is None  # collected (single node)
    assert r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k") == first
    assert r.execute_command("QLEN", "q") == 0
    second = r.execute_command("ADDJOB", "q", "b2", 0, "IDMP", "k2", "TTL", 1)
    assert r.execute_command("DELJOB", second) == 1
    assert r.execute_command("ADDJOB", "q", "b2", 0, "IDMP", "k2") == second
    assert r.execute_command("QLEN", "q") == 0


def test_window_ends_then_the_key_adds_a_new_job(r: redis.Redis) -> None:
    first = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k", "IDMP-WINDOW", 1)
    assert r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k") == first
    # The cron drops the key once its window ends (no timer per key).
    wait_for(lambda: ext_info(r)["idmp_keys"] == 0, 5, message="the key to expire")
    assert ext_info(r)["idmp_expired_keys"] == 1
    second = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k")
    assert second != first
    assert r.execute_command("QLEN", "q") == 2


def test_paused_or_full_queue_still_answers_a_retry(r: redis.Redis) -> None:
    first = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k")
    r.execute_command("PAUSE", "q", "in")
    assert r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k") == first
    with pytest.raises(redis.ResponseError, match=r"^PAUSED"):
        r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "new")
    r.execute_command("PAUSE", "q", "none")
    assert r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k", "MAXLEN", 1) == first


def test_refused_addjob_leaves_no_key(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="DELAY is greater than TTL"):
        r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k", "TTL", 5, "DELAY", 10)
    with pytest.raises(redis.ResponseError, match=r"^NOREPL"):
        r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k", "REPLICATE", 2)
    assert ext_info(r)["idmp_keys"] == 0
    job = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k")
    assert r.execute_command("QLEN", "q") == 1 and job.startswith(b"D-")


@pytest.mark.parametrize(("args", "error"), [
    (["IDMP"], "ERR syntax error"),
    (["IDMP", ""], "ERR IDMP key must be 1 to 256 bytes long"),
    (["IDMP", "x" * 257], "ERR IDMP key must be 1 to 256 bytes long"),
    (["IDMP", "x" * 1_000_000], "ERR IDMP key must be 1 to 256 bytes long"),
    (["IDMP-WINDOW", "10"], "ERR IDMP-WINDOW needs IDMP <key>"),
    (["IDMP", "k", "IDMP-WINDOW"], "ERR syntax error"),
    (["IDMP", "k", "IDMP-WINDOW", "0"], "ERR IDMP-WINDOW must be between 1 and 86400 seconds"),
    (["IDMP", "k", "IDMP-WINDOW", "-1"],
     "ERR IDMP-WINDOW must be between 1 and 86400 seconds"),
    (["IDMP", "k", "IDMP-WINDOW", "86401"],
     "ERR IDMP-WINDOW must be between 1 and 86400 seconds"),
    (["IDMP", "k", "IDMP-WINDOW", "99999999999999999999999"],
     "ERR IDMP-WINDOW must be between 1 and 86400 seconds"),
    (["IDMP", "k", "IDMP-WINDOW", "1.5"], "ERR IDMP-WINDOW must be between 1 and 86400 seconds"),
    (["IDMP", "k", "IDMP-WINDOWS", "10"], "ERR syntax error"),
    (["IDMPX", "k"], "ERR syntax error"),
])
def test_bad_idmp_options(r: redis.Redis, args: list[str], error: str) -> None:
    with pytest.raises(redis.ResponseError) as err:
        r.execute_command("ADDJOB", "q", "body", 0, *args)
    assert str(err.value) == error.removeprefix("ERR ")  # redis-py drops the "ERR "
    assert r.execute_command("QLEN", "q") == 0
    assert ext_info(r)["idmp_keys"] == 0
    assert r.ping()


def test_keys_count_in_memory_and_max_keys_evicts_oldest(server_factory) -> None:
    node: DisqueProcess = server_factory("--idmp-max-keys", "3")
    r = node.client()
    before = r.info("memory")["used_memory_dataset"]
    ids = [r.execute_command("ADDJOB", "q", "b", 0, "IDMP", f"k{i}",
                             "IDMP-WINDOW", 100 + i) for i in range(4)]
    info = ext_info(r)
    assert info["idmp_keys"] == 3 and info["idmp_evicted_keys"] == 1
    # k0 (closest to its end) was evicted: its retry adds a job; k1 is kept.
    assert r.execute_command("ADDJOB", "q", "b", 0, "IDMP", "k1") == ids[1]
    assert r.execute_command("ADDJOB", "q", "b", 0, "IDMP", "k0") not in ids
    used = r.info("memory")["used_memory_dataset"]
    # Five jobs plus three keys (the node runs the same core as this process).
    assert used > before + 5 * JOB_OVERHEAD_BYTES + 3 * 360
    r.execute_command("CONFIG", "SET", "idmp-max-keys", "100")
    assert r.execute_command("CONFIG", "GET", "idmp-max-keys") == [b"idmp-max-keys", b"100"]
    with pytest.raises(redis.ResponseError):
        r.execute_command("CONFIG", "SET", "idmp-max-keys", "0")


def test_addjob_without_idmp_is_unchanged(r: redis.Redis) -> None:
    a = r.execute_command("ADDJOB", "q", "body", 0)
    b = r.execute_command("ADDJOB", "q", "body", 0)
    assert a != b and r.execute_command("QLEN", "q") == 2
    assert ext_info(r)["idmp_keys"] == 0
