"""Client and CLI support of the extensions IDMP (idempotent ADDJOB) and WAITJOB."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from disque import AsyncClient, Client, IdmpConflict, NoJob
from disque.cli.prompt import HELP
from disque.cli.session import waiting_hint
from tests.client.conftest import address, fake_job_id
from tests.client.test_cli import disque
from tests.support.process import DisqueProcess


def test_add_job_idmp(client: Client) -> None:
    first = client.add_job("q", b"body", idmp="order-7")
    assert client.add_job("q", b"body", idmp="order-7", idmp_window=60) == first
    assert client.qlen("q") == 1
    with pytest.raises(IdmpConflict) as err:
        client.add_job("q", b"changed", idmp="order-7")
    assert first in str(err.value) and err.value.code == "IDMPCONFLICT"
    with pytest.raises(ValueError, match="idmp_window needs idmp"):
        client.add_job("q", b"body", idmp_window=60)
    assert client.qlen("q") == 1
    # add_jobs passes the options through (one key for all bodies is a conflict).
    results = client.add_jobs("q", [b"a", b"b"], idmp="batch", return_exceptions=True)
    assert isinstance(results[0], str) and isinstance(results[1], IdmpConflict)


def test_request_response_with_wait_job(server: DisqueProcess, client: Client) -> None:
    """The producer waits for the worker's ACK: the pattern of jobs/ and the docs."""
    def worker() -> None:
        with Client(address(server)) as w:
            job = w.get_jobs("requests", timeout_ms=5000)[0]
            w.add_job("replies:" + job.body.decode(), b"result for " + job.body)
            w.ack(job.id)

    thread = threading.Thread(target=worker)
    thread.start()
    job_id = client.add_job("requests", b"r1")
    assert client.wait_job(job_id, timeout_ms=10_000) is True
    thread.join(5)
    reply = client.get_jobs("replies:r1", nohang=True)
    assert [j.body for j in reply] == [b"result for r1"]
    # Acked already: answers at once, still True.
    assert client.wait_job(job_id, timeout_ms=1) is True


def test_wait_job_timeout_and_unknown(client: Client) -> None:
    job_id = client.add_job("q", b"nobody takes it")
    started = time.monotonic()
    assert client.wait_job(job_id, timeout_ms=100) is False
    assert time.monotonic() - started < 5
    with pytest.raises(NoJob, match="not known"):
        client.wait_job(fake_job_id(), timeout_ms=100)


def test_async_client(server: DisqueProcess) -> None:
    async def scenario() -> None:
        async with AsyncClient(address(server)) as c:
            first = await c.add_job("aq", b"x", idmp="k", idmp_window=10)
            assert await c.add_job("aq", b"x", idmp="k") == first
            waiter = asyncio.create_task(c.wait_job(first, timeout_ms=10_000))
            async with AsyncClient(address(server)) as worker:
                job = (await worker.get_jobs("aq", timeout_ms=5000))[0]
                await asyncio.sleep(0)  # let the waiter send WAITJOB (its reply needs the ACK)
                await worker.ack(job.id)
            assert await waiter is True
            assert await c.wait_job(first, 50) is True
            with pytest.raises(IdmpConflict):
                await c.add_job("aq", b"y", idmp="k")

    asyncio.run(scenario())


def test_cli(server: DisqueProcess) -> None:
    p = server.port
    added = disque(p, "addjob", "q", "body", "0", "IDMP", "cli-key")
    again = disque(p, "addjob", "q", "body", "0", "IDMP", "cli-key")
    assert added.returncode == 0 and added.stdout == again.stdout
    job_id = added.stdout.strip()
    conflict = disque(p, "addjob", "q", "other", "0", "IDMP", "cli-key")
    assert conflict.stdout.startswith("IDMPCONFLICT IDMP key already used")  # piped: raw
    assert disque(p, "waitjob", job_id, "100").stdout == "\n"  # null, raw
    assert disque(p, "ackjob", job_id).stdout == "1\n"
    assert disque(p, "waitjob", job_id, "100").stdout == "ACKED\n"
    assert "WAITJOB id ms-timeout" in HELP and "IDMP key [IDMP-WINDOW s]" in HELP


def test_cli_says_what_waitjob_waits_for() -> None:
    job = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    assert waiting_hint([b"WAITJOB", job.encode(), b"0"]) == (
        f"(waiting until job {job} is acknowledged; Ctrl-C stops)")
    assert waiting_hint([b"waitjob", job.encode(), b"1500"]) == (
        f"(waiting until job {job} is acknowledged, for up to 1500 ms; Ctrl-C stops)")
    assert waiting_hint([b"waitjob", job.encode(), b"-1"]) is None
