"""The console over a mixed cluster: two of our nodes and the original (1.0-rc1).

Pages that need this server's extensions hide what the original cannot
answer (QLIMIT, NACK's delay) instead of showing its "unknown command".
"""

from __future__ import annotations

from contextlib import closing
from urllib.parse import quote

import httpx
import pytest

from disque import Client, DisqueError
from tests.console.conftest import api, csrf_of
from tests.support.cluster import reference_server, with_original

pytestmark = pytest.mark.skipif(
    reference_server() is None,
    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its disque-server")


def test_a_mixed_cluster_shows_every_node_and_hides_what_the_original_lacks(
        server_factory, console_factory, tmp_path) -> None:
    with with_original(server_factory, tmp_path) as (mine, original):
        console = console_factory([original, *mine])
        with closing(httpx.Client(base_url=console.url, timeout=30)) as web:
            web.get("/")
            kinds = {n["address"]: n["implementation"]
                     for n in api(web, "/api/overview")["nodes"]}
            assert kinds[f"127.0.0.1:{original.port}"] == "original"
            assert sorted(kinds.values()) == ["disque-py", "disque-py", "original"]
            with Client(f"127.0.0.1:{original.port}", randomize=False) as c:
                job_id = c.add_job("mixed", b"from the original", replicate=1, retry=30)
            queue = api(web, "/api/queues/mixed")
            on_original = next(n for n in queue["nodes"]
                               if n["address"] == f"127.0.0.1:{original.port}")
            assert on_original["length"] == 1 and on_original["extensions"] is False
            assert queue["qlimit_supported"]  # our nodes still take it
            assert "n/a (original)" in web.get("/queues/mixed").text
            job = api(web, f"/api/jobs/{quote(job_id, safe='')}")
            assert job["found"] and job["nack_delay"] is False
            # The original has no SHOW ... NOBODY (its arity error): the
            # console reads its jobs with plain SHOW, the body view included.
            with (Client(f"127.0.0.1:{original.port}", randomize=False) as c,
                  pytest.raises(DisqueError, match="wrong number of arguments for 'show'")):
                c.execute_command("SHOW", job_id, "NOBODY")
            assert job["body"]["text"] == "from the original"
            assert job["copies"][0]["size"] == len(b"from the original")
            listed = queue["browser"]["jobs"]
            assert [(j["id"], j["size"]) for j in listed] == [(job_id, 17)]
            assert 'id="nack-delay"' not in web.get(f"/jobs/{quote(job_id, safe='')}").text
            token = csrf_of(web)
            limit = web.post("/api/actions/qlimit", json={"queue": "mixed", "max": 3,
                                                          "period_ms": 1000},
                             headers={"X-CSRF-Token": token})
            assert limit.status_code == 200, limit.text  # the original is skipped, not an error
            assert {r["node"] for r in limit.json()["results"]} == {
                f"127.0.0.1:{n.port}" for n in mine}
            pause = web.post("/api/actions/pause", json={"queue": "mixed", "state": "none"},
                             headers={"X-CSRF-Token": token})
            assert pause.status_code == 200 and len(pause.json()["results"]) == 3
            for path in ("/", "/queues", "/nodes", "/dead-letters"):
                assert web.get(path).status_code == 200, path


def test_job_rates_leave_the_original_out_and_a_move_of_its_jobs_goes_elsewhere(
        server_factory, console_factory, tmp_path) -> None:
    from tests.console.test_bulk import finished, start
    from tests.console.workload import node_client

    with with_original(server_factory, tmp_path) as (mine, original):
        console = console_factory([original, *mine])
        with closing(httpx.Client(base_url=console.url, timeout=30)) as web:
            web.get("/")
            web.headers["X-CSRF-Token"] = csrf_of(web)
            overview = api(web, "/api/overview")
            assert overview["uncounted"] == [f"127.0.0.1:{original.port}"]
            assert overview["job_rates"]
            page = web.get("/").text
            assert 'id="chart-flow"' in page and "original nodes without job counters" in page
            # Jobs created by the original: their move's ADDJOB cannot go there
            # (no IDMP), so it goes to one of ours, and each moves once.
            with node_client(original) as c:
                ids = c.add_jobs("from-original", [f"o{i}".encode() for i in range(12)],
                                 replicate=1, retry=30)
            assert len(ids) == 12
            task = finished(web, start(web, "bulk", op="move", queue="from-original",
                                       to="moved-here", rate=500)["id"])
            assert task["state"] == "finished" and task["counts"]["done"] == 12, task
            moved = []
            for node in [original, *mine]:
                with node_client(node) as c:
                    moved += [j["body"] for j in c.jscan(queue="moved-here", reply="all")
                              if j["state"] == "queued"]
                    assert c.qlen("from-original") == 0
            assert sorted(moved) == sorted(f"o{i}".encode() for i in range(12))
