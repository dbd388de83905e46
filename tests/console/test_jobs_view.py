"""The job lists and job pages against real nodes: metadata without bodies
(``SHOW id NOBODY``), and a job browser that fills its page among many jobs."""

from __future__ import annotations

import json
import time
from contextlib import closing
from urllib.parse import quote

import httpx
import pytest

from disque import Client
from tests.console.conftest import ConsoleProcess, api
from tests.support.process import DisqueProcess

BODY = b"B" * (2 * 1024 * 1024)


def output_bytes(node: DisqueProcess) -> int:
    """What ``node`` has written to its clients so far (INFO stats)."""
    with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
        return int(c.info("stats")["stats"]["total_net_output_bytes"])


def live_updates(web: httpx.Client, path: str, count: int) -> list[dict]:
    """The first ``count`` updates of a page's event stream (``: tick`` ends each)."""
    swaps: list[dict] = []
    ticks = 0
    with web.stream("GET", path, timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {\"target\""):
                swaps.append(json.loads(line[len("data: "):]))
            elif line.startswith(": tick"):
                ticks += 1
                if ticks >= count:
                    break
    return swaps


def test_job_lists_and_live_updates_read_no_bodies(cluster, open_console) -> None:
    """A 2 MB job not queued (delayed, so no QPEEK returns it): listing it
    in its queue's job browser and the live updates of its page move far
    less than its body out of its node; the body view reads it once."""
    node = cluster[0]
    with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
        job_id = c.add_job("nobody:big", BODY, replicate=1, delay=3600, retry=3600)
    with closing(httpx.Client(base_url=open_console.url, timeout=30)) as web:
        assert web.get("/").status_code == 200
        api(web, "/api/queues/nobody:big")  # the pool learns what the nodes have
        before = output_bytes(node)
        for _ in range(3):
            browser = api(web, "/api/queues/nobody:big")["browser"]
            assert [(j["id"], j["size"], j["state"]) for j in browser["jobs"]] == [
                (job_id, len(BODY), "active")]
        swaps = live_updates(web, f"/events/job/{quote(job_id, safe='')}", 3)
        assert swaps and 'id="job-copies"' in swaps[0]["html"]
        moved = output_bytes(node) - before
        assert moved < len(BODY) // 4, f"{moved} bytes out of the node: a body was read"
        # The job page itself shows the body (one read), with its size.
        data = api(web, f"/api/jobs/{quote(job_id, safe='')}")
        assert data["body"]["size"] == len(BODY) and data["body"]["cut"]
        assert data["copies"][0]["size"] == len(BODY)
        assert "body-size" not in data["copies"][0]
        assert output_bytes(node) - before >= len(BODY)
    with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
        c.del_job(job_id)


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> DisqueProcess:
    """One node holding 60,000 jobs in 300 queues, and 200 in ``needle``."""
    node = DisqueProcess(tmp_path_factory.mktemp("crowded")).start()
    with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
        for q in range(300):
            c.add_jobs(f"hay:{q}", [b"h"] * 200, retry=3600)
        c.add_jobs("needle", [b"n%d" % i for i in range(200)], retry=3600)
    yield node
    node.kill()


def test_a_filter_that_matches_few_jobs_still_fills_the_page(crowded, console_factory) -> None:
    """200 jobs among 60,200: one JSCAN call of a page looks at ~1,000 of
    them, so the page goes on with the cursor until it holds 25."""
    console: ConsoleProcess = console_factory([crowded])
    with closing(httpx.Client(base_url=console.url, timeout=30)) as web:
        web.get("/")
        browser = api(web, "/api/queues/needle", state="queued")["browser"]
        assert len(browser["jobs"]) == 25 and not browser["more"], browser
        assert {j["queue"] for j in browser["jobs"]} == {"needle"}
        assert browser["calls"] > 1 and browser["next"]
        page = web.get("/queues/needle")
        assert page.text.count('class="job-link"') == 25


def test_a_page_that_runs_out_of_time_offers_more_and_changes_nothing(
        crowded, console_factory) -> None:
    """No job is acked: a page given 5 ms runs out of time before it finds
    one, says so with a "more" link, and the pages together walk the whole
    table to its end; no job's state changed."""
    with Client(f"127.0.0.1:{crowded.port}", randomize=False) as c:
        lengths = {q: c.qlen(q) for q in ("needle", "hay:0", "hay:299")}
        stats = c.info("stats")["stats"]
    console: ConsoleProcess = console_factory([crowded], "--browse-budget", "5")
    with closing(httpx.Client(base_url=console.url, timeout=30)) as web:
        web.get("/")
        token, pages, calls = "", 0, 0
        started = time.monotonic()
        while True:
            reply = web.get("/api/queues/needle", params={"state": "acked", "token": token})
            assert reply.status_code == 200, reply.text
            browser = reply.json()["browser"]
            assert browser["jobs"] == []
            pages += 1
            calls += browser["calls"]
            if pages == 1:
                assert browser["more"] and browser["next"], browser
                html = web.get("/queues/needle", params={"state": "acked"}).text
                assert 'id="jobs-more"' in html and "stopped before the page was full" in html
            token = browser["next"]
            if not token:
                break
            assert time.monotonic() - started < 60, "the pages never reached the end"
        assert pages >= 2 and calls >= 50  # ~60,200 jobs, ~1,000 a call
    with Client(f"127.0.0.1:{crowded.port}", randomize=False) as c:
        assert {q: c.qlen(q) for q in lengths} == lengths
        after = c.info("stats")["stats"]
        for counter in ("acked_jobs", "delivered_jobs"):
            if counter in stats:
                assert after[counter] == stats[counter], counter
