import redis


def test_ping_and_job_round_trip(r: redis.Redis) -> None:
    assert r.ping()
    job_id = r.execute_command("ADDJOB", "q", b"hello\x00world", 0)
    assert isinstance(job_id, bytes) and len(job_id) == 40
    jobs = r.execute_command("GETJOB", "NOHANG", "FROM", "q")
    assert jobs == [[b"q", job_id, b"hello\x00world"]]
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("SHOW", job_id) is None
