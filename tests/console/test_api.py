"""The console's pages and JSON API against a real 3-node cluster, over HTTP."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from disque import Client
from tests.console.conftest import ConsoleProcess, api, csrf_of
from tests.support.process import DisqueProcess, wait_for


def seeds(nodes: list[DisqueProcess]) -> str:
    return ",".join(f"127.0.0.1:{n.port}" for n in nodes)


@pytest.fixture
def web(open_console: ConsoleProcess) -> Iterator[httpx.Client]:
    """A browser-like client of the open console (it gets a session cookie)."""
    with httpx.Client(base_url=open_console.url, timeout=30) as client:
        assert client.get("/").status_code == 200
        yield client


def node_client(node: DisqueProcess) -> Client:
    return Client(f"127.0.0.1:{node.port}", randomize=False)


def test_overview_lists_every_node_with_its_figures(cluster, web) -> None:
    data = api(web, "/api/overview")
    ids = set()
    for node in cluster:
        with node_client(node) as c:
            ids.add(c.cluster_myid())
    assert {row["id"] for row in data["nodes"]} == ids
    for row in data["nodes"]:
        assert row["state"] == "ok" and row["implementation"] == "disque-py"
        assert row["maxmemory"] > row["used_memory"] > 0
        assert row["aof"]["state"] == "off" and row["uptime"] >= 0
    assert data["totals"]["up"] == 3 and data["levels"] == [75, 95, 100]
    page = web.get("/")
    assert page.status_code == 200 and "Open console" in page.text  # no password: said
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


def test_queues_are_merged_across_nodes_filtered_sorted_and_paged(cluster, web) -> None:
    for i, node in enumerate(cluster):
        with node_client(node) as c:
            c.add_jobs("merge:orders", [b"x"] * (i + 1), replicate=1)
            c.add_jobs(f"merge:only{i}", [b"y"] * (10 + i), replicate=1)
    data = api(web, "/api/queues", pattern="merge:*", fresh=1)
    rows = {q["name"]: q for q in data["queues"]}
    assert rows["merge:orders"]["length"] == 6
    assert sorted(q["length"] for q in rows["merge:orders"]["per_node"].values()) == [1, 2, 3]
    assert [q["name"] for q in data["queues"]][:3] == ["merge:only2", "merge:only1",
                                                        "merge:only0"]
    assert data["matched"] == 4
    by_name = api(web, "/api/queues", pattern="merge:*", sort="name", order="asc")
    assert [q["name"] for q in by_name["queues"]] == sorted(rows)
    long_ones = api(web, "/api/queues", pattern="merge:*", min_length=11)
    assert {q["name"] for q in long_ones["queues"]} == {"merge:only1", "merge:only2"}
    # Paging: every queue once, in order, whatever the page size.
    pages, seen = 1, []
    while True:
        page = api(web, "/api/queues", pattern="merge:*", sort="name", order="asc",
                   per_page=3, page=pages)
        seen += [q["name"] for q in page["queues"]]
        if pages >= page["pages"]:
            break
        pages += 1
    assert seen == sorted(rows) and pages == 2


def test_a_malformed_filter_is_a_clear_message_and_changes_nothing(open_console, web) -> None:
    for params, words in (({"min_length": "abc"}, "min_length must be a whole number"),
                          ({"sort": "nope"}, "cannot sort on 'nope'"),
                          ({"page": "0"}, "page must be between"),
                          ({"paused": "maybe"}, "paused must be any, yes or no")):
        reply = web.get("/api/queues", params=params)
        assert reply.status_code == 400 and words in reply.json()["error"], reply.text
        page = web.get("/queues", params=params)
        assert page.status_code == 400 and words in page.text.replace("&#39;", "'")
    assert open_console.alive() and web.get("/api/queues").status_code == 200


def test_pause_needs_csrf_and_confirmation_then_reaches_every_node(cluster, web) -> None:
    with node_client(cluster[0]) as c:
        c.add_job("pausable", b"x")
    token = csrf_of(web, "/queues/pausable")
    form = {"action": "pause", "queue": "pausable", "state": "in", "back": "/queues/pausable"}
    assert web.post("/actions", data=form).status_code == 403            # no token
    assert web.post("/actions", data={**form, "csrf": "x" * 43}).status_code == 403
    asked = web.post("/actions", data={**form, "csrf": token})           # not confirmed yet
    assert asked.status_code == 200 and 'id="confirm"' in asked.text
    for node in cluster:
        with node_client(node) as c:
            assert c.pause("pausable") == "none"                         # nothing done
    done = web.post("/actions", data={**form, "csrf": token, "confirm": "yes"})
    assert done.status_code == 303 and done.headers["location"] == "/queues/pausable"
    for node in cluster:
        with node_client(node) as c:
            assert c.pause("pausable") == "in"
    assert "pause queue:pausable: done" in web.get("/queues/pausable").text
    api_reply = web.post("/api/actions/pause", json={"queue": "pausable", "state": "none"})
    assert api_reply.status_code == 403                                  # no X-CSRF-Token
    api_reply = web.post("/api/actions/pause", json={"queue": "pausable", "state": "none"},
                         headers={"X-CSRF-Token": token})
    assert api_reply.status_code == 200 and api_reply.json()["ok"]
    assert [r["value"] for r in api_reply.json()["results"]] == ["none"] * 3


def test_rate_limit_set_and_cleared_on_every_node(cluster, web) -> None:
    token = csrf_of(web)
    headers = {"X-CSRF-Token": token}
    reply = web.post("/api/actions/qlimit", json={"queue": "limited", "max": 5,
                                                  "period_ms": 1000}, headers=headers)
    assert reply.status_code == 200, reply.text
    for node in cluster:
        with node_client(node) as c:
            assert c.qlimit("limited") == (5, 1000)
    assert api(web, "/api/queues/limited")["limit"] == [5, 1000]
    bad = web.post("/api/actions/qlimit", json={"queue": "limited", "max": 0, "period_ms": 1},
                   headers=headers)
    assert bad.status_code == 400 and "rate limit" in bad.json()["error"]
    web.post("/api/actions/qlimit", json={"queue": "limited", "off": 1}, headers=headers)
    for node in cluster:
        with node_client(node) as c:
            assert c.qlimit("limited") is None


def test_job_page_shows_show_fields_and_actions_act(cluster, web) -> None:
    with node_client(cluster[1]) as c:
        job_id = c.add_job("jobs:page", b'{"order": 42, "items": [1, 2]}', retry=60,
                           max_deliveries=5, priority=3)
    data = api(web, f"/api/jobs/{quote(job_id, safe='')}")
    assert data["found"] and data["queue"] == "jobs:page" and data["state"] == "queued"
    assert len(data["copies"]) == 3  # REPLICATE defaults to 3 here
    first = data["copies"][0]
    assert first["node_id"].startswith(job_id[2:10])  # the creator first
    assert first["priority"] == 3 and first["max-deliveries"] == 5
    assert data["body"]["kind"] == "json" and '"order": 42' in data["body"]["json"]
    assert data["body"]["size"] == 30 and not data["body"]["cut"]
    token = csrf_of(web)
    headers = {"X-CSRF-Token": token}
    with node_client(cluster[1]) as c:
        assert [j.id for j in c.get_jobs("jobs:page", nohang=True)] == [job_id]
    nack = web.post("/api/actions/job", json={"op": "nack", "id": job_id, "delay": 30},
                    headers=headers)
    assert nack.status_code == 200, nack.text
    shown = api(web, f"/api/jobs/{quote(job_id, safe='')}")
    assert shown["state"] == "active"  # held back for the delay, then queued
    page = web.get(f"/jobs/{quote(job_id, safe='')}")
    assert page.status_code == 200 and 'id="nack-delay"' in page.text
    ack = web.post("/api/actions/job", json={"op": "ack", "id": job_id}, headers=headers)
    assert ack.status_code == 200
    wait_for(lambda: not api(web, f"/api/jobs/{quote(job_id, safe='')}")["found"], 10,
             message="the acked job to be collected")


def test_the_job_page_shows_the_jobs_ordered_group(cluster, web) -> None:
    with node_client(cluster[0]) as c:
        grouped = c.add_job("jobs:grouped", b"first", group="customer <42>")
        plain = c.add_job("jobs:grouped", b"second")
    data = api(web, f"/api/jobs/{quote(grouped, safe='')}")
    assert data["found"] and data["group"] == "customer <42>"
    page = web.get(f"/jobs/{quote(grouped, safe='')}")
    assert page.status_code == 200
    assert '<code id="job-group">customer &lt;42&gt;</code>' in page.text  # escaped
    assert api(web, f"/api/jobs/{quote(plain, safe='')}")["group"] is None
    assert 'id="job-group"' not in web.get(f"/jobs/{quote(plain, safe='')}").text


def test_unknown_and_malformed_job_ids_get_clear_messages(web, open_console) -> None:
    unknown = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
    data = api(web, f"/api/jobs/{unknown}")
    assert not data["found"] and data["copies"] == []
    page = web.get(f"/jobs/{unknown}")
    assert page.status_code == 200 and "No node knows job" in page.text
    bad = web.get("/api/jobs/not-a-job")
    assert bad.status_code == 400 and "is not a job ID" in bad.json()["error"]
    token = csrf_of(web)
    act = web.post("/api/actions/job", json={"op": "ack", "id": unknown},
                   headers={"X-CSRF-Token": token})
    assert act.status_code == 409 and "no node knows this job" in act.json()["summary"]
    assert open_console.alive()


def test_browsing_jobs_never_changes_their_state(cluster, web) -> None:
    with node_client(cluster[2]) as c:
        ids = c.add_jobs("browse", [f"b{i}".encode() for i in range(30)], retry=120)
        before = {i: c.show(i) for i in ids}
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        reply = web.get("/api/queues/browse", params={"state": "queued", "per_page": 7,
                                                      "token": token})
        assert reply.status_code == 200, reply.text
        browser = reply.json()["browser"]
        seen += [j["id"] for j in browser["jobs"] if j["state"] == "queued"]
        pages += 1
        token = browser["next"]
        if not token:
            break
    assert set(seen) == set(ids) and pages >= 2
    with node_client(cluster[2]) as c:
        for job_id in ids:
            after = c.show(job_id)
            assert after is not None
            for field in ("state", "nacks", "additional-deliveries", "queue"):
                assert after[field] == before[job_id][field]
        assert c.qlen("browse") == 30
    page = web.get("/queues/browse", params={"state": "queued"})
    assert page.status_code == 200 and page.text.count('class="job-link"') == 25


def test_a_100_mb_body_is_shown_cut_with_its_size(cluster, web, open_console) -> None:
    body = b"x" * (100 * 1024 * 1024)
    with node_client(cluster[0]) as c:
        job_id = c.add_job("huge", body, replicate=1)
    reply = web.get(f"/api/jobs/{quote(job_id, safe='')}")
    assert reply.status_code == 200
    data = reply.json()
    assert data["body"]["size"] == len(body) and data["body"]["shown"] == 64 * 1024
    assert data["body"]["cut"] and len(reply.content) < 1024 * 1024
    page = web.get(f"/jobs/{quote(job_id, safe='')}")
    assert "100.0 MiB (104857600 bytes): showing the first 64.0 KiB" in page.text
    assert len(page.content) < 1024 * 1024
    browse = web.get("/api/queues/huge")
    assert browse.status_code == 200 and browse.json()["browser"]["jobs"][0]["size"] == len(body)
    assert open_console.alive()
    with node_client(cluster[0]) as c:
        c.del_job(job_id)


def test_history_is_sampled_and_outlives_a_restart(cluster, console_factory, tmp_path,
                                                   request) -> None:
    data_dir = tmp_path / "data"
    console = console_factory(cluster, "--data-dir", str(data_dir))
    web = httpx.Client(base_url=console.url, timeout=30)
    request.addfinalizer(web.close)

    def points() -> list:
        reply = web.get("/api/history", params={"series": "used_memory"})
        assert reply.status_code == 200, reply.text
        return reply.json()["total"]

    wait_for(lambda: len(points()) >= 3, 20, message="three samples")
    before = points()
    assert (data_dir / "history.jsonl").stat().st_size > 0
    console.stop()
    restarted = console_factory(cluster, "--data-dir", str(data_dir), name="again")
    web = httpx.Client(base_url=restarted.url, timeout=30)
    request.addfinalizer(web.close)
    after = points()
    assert before[0] in after  # the first samples came back from the file
    rates = web.get("/api/history", params={"series": "total_commands_processed"}).json()
    assert len(rates["nodes"]) == 3 and all(v >= 0 for _, v in rates["total"])


def test_a_node_down_mid_action_is_reported_and_the_rest_acts(server_factory, console_factory,
                                                             request) -> None:
    from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined

    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    console = console_factory(nodes)
    web = httpx.Client(base_url=console.url, timeout=30)
    request.addfinalizer(web.close)
    assert len(api(web, "/api/overview")["nodes"]) == 3
    token = csrf_of(web)
    nodes[2].kill()
    reply = web.post("/api/actions/pause", json={"queue": "downq", "state": "out"},
                     headers={"X-CSRF-Token": token})
    assert reply.status_code == 409
    results = {r["node"]: r for r in reply.json()["results"]}
    assert results[f"127.0.0.1:{nodes[2].port}"]["kind"] == "down"
    for node in nodes[:2]:
        assert results[f"127.0.0.1:{node.port}"]["ok"]
        with node_client(node) as c:
            assert c.pause("downq") == "out"
    overview = api(web, "/api/overview")
    down = [n for n in overview["nodes"] if n["address"] == f"127.0.0.1:{nodes[2].port}"]
    assert down[0]["state"] == "down" and overview["totals"]["up"] == 2
    for path in ("/", "/queues", "/queues/downq", "/nodes", "/dead-letters"):
        assert web.get(path).status_code == 200, path
    assert console.alive()


def test_dead_letters_listed_with_count_age_and_origin(cluster, web) -> None:
    with node_client(cluster[0]) as c:
        job_id = c.add_job("dl:src", b"poison", retry=1, max_deliveries=1, replicate=1)
        assert c.get_jobs("dl:src", nohang=True)
        c.nack(job_id)  # the second delivery would exceed 1: moved to dl:src:dead
        wait_for(lambda: c.qlen("dl:src:dead") == 1, 10, message="the dead letter")
    data = api(web, "/api/dead-letters", fresh=1)
    row = next(q for q in data["queues"] if q["name"] == "dl:src:dead")
    assert row["length"] == 1 and row["origin"] == "dl:src" and row["oldest_age"] >= 0
    assert "dl:src:dead" in web.get("/dead-letters").text


def test_nodes_page_shows_each_nodes_table_and_toggles_leaving(cluster, web) -> None:
    data = api(web, "/api/nodes")
    assert len(data["nodes"]) == 3
    for entry in data["nodes"]:
        assert len(entry["table"]) == 3 and {e["link"] for e in entry["table"]} == {"connected"}
        assert entry["leaving"] is False and "aof_state" in entry["aof"]
    target = data["nodes"][1]["address"]
    token = csrf_of(web, "/nodes")
    form = {"csrf": token, "action": "leaving", "node": target, "value": "yes",
            "back": "/nodes"}
    assert 'id="confirm"' in web.post("/actions", data=form).text  # asks first
    assert web.post("/actions", data={**form, "confirm": "yes"}).status_code == 303
    leaving = next(n for n in api(web, "/api/nodes")["nodes"] if n["address"] == target)
    assert leaving["leaving"] is True
    web.post("/actions", data={**form, "value": "no"})
    leaving = next(n for n in api(web, "/api/nodes")["nodes"] if n["address"] == target)
    assert leaving["leaving"] is False


def test_sse_streams_the_live_parts_of_a_page(cluster, web) -> None:
    with node_client(cluster[0]) as c:
        c.add_job("sse:q", b"x")
    deadline = time.monotonic() + 20
    events: list[str] = []
    with web.stream("GET", "/events/queues", params={"pattern": "sse:*"}) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            events.append(line)
            if any("sse:q" in e for e in events) or time.monotonic() > deadline:
                break
    # The first swap may be the table built before the job (the queue table
    # is rebuilt in the background); a later one brings the queue.
    swaps = [e for e in events if e.startswith("data: ") and "live-queues" in e]
    assert any("sse:q" in e for e in swaps), events


def test_binding_outside_loopback_in_front_of_open_nodes_is_refused(cluster, tmp_path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "disque.console", "--nodes", seeds(cluster), "--bind",
         "0.0.0.0", "--port", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "refusing to serve on 0.0.0.0: the nodes take no password" in result.stderr
    assert "--allow-open" in result.stderr


def test_audit_lines_name_user_action_and_target(open_console, web, cluster) -> None:
    token = csrf_of(web)
    web.post("/api/actions/pause", json={"queue": "audited", "state": "none"},
             headers={"X-CSRF-Token": token})
    wait_for(lambda: re.search(r"user=default action=pause target=queue:audited state=none "
                               r"result=ok", open_console.log()), 10, message="the audit line")


def test_the_overview_shows_each_nodes_links_and_a_peer_gone(server_factory, console_factory,
                                                             request) -> None:
    from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined

    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    console = console_factory(nodes)
    web = httpx.Client(base_url=console.url, timeout=30)
    request.addfinalizer(web.close)
    rows = api(web, "/api/overview")["nodes"]
    assert [r["links"] for r in rows] == [{"up": 2, "total": 2, "down": []}] * 3
    gone = f"127.0.0.1:{nodes[2].port}"
    nodes[2].kill()

    def links_down() -> list | None:
        rows = {r["address"]: r for r in api(web, "/api/overview")["nodes"]}
        live = [rows[f"127.0.0.1:{n.port}"]["links"] for n in nodes[:2]]
        return live if all(v and v["down"] == [gone] for v in live) else None

    live = wait_for(links_down, 30, interval=0.2, message="the links to the killed node down")
    assert all(v["up"] == 1 and v["total"] == 2 for v in live)
    page = web.get("/").text
    assert "1/2 connected" in page and f"down: {gone}" in page


def test_a_queue_name_that_is_not_utf8_fails_no_page(cluster, web) -> None:
    # A producer chooses queue names: bytes that are not UTF-8 reach the
    # templates and JSON as surrogates, which failed every page listing them.
    name = b"bin\xffary:q"
    with node_client(cluster[0]) as c:
        job_id = c.add_job(name, b"x", replicate=1)
    try:
        reply = web.get("/api/queues", params={"pattern": "bin*", "fresh": 1})
        assert reply.status_code == 200, reply.text
        # ASCII JSON: the name reads back as the string the node's bytes make.
        assert [q["name"] for q in reply.json()["queues"]] == [
            name.decode("utf-8", "surrogateescape")]
        page = web.get("/queues", params={"pattern": "bin*"})
        assert page.status_code == 200 and "bin\\udcffary:q" in page.text
        assert 'href="/queues/bin%FFary%3Aq"' in page.text
        job = web.get(f"/jobs/{quote(job_id, safe='')}")
        assert job.status_code == 200 and "bin\\udcffary:q" in job.text
        assert web.get(f"/api/jobs/{quote(job_id, safe='')}").status_code == 200
        assert web.get("/dead-letters").status_code == 200
    finally:
        with node_client(cluster[0]) as c:
            c.del_job(job_id)


def test_a_newline_in_a_value_cannot_forge_an_audit_line(open_console, web, cluster) -> None:
    token = csrf_of(web)
    forged = "x\nuser=admin action=deljob target=job:forged result=ok"
    reply = web.post("/api/actions/pause", json={"queue": forged, "state": "none"},
                     headers={"X-CSRF-Token": token})
    assert reply.status_code == 200, reply.text
    wait_for(lambda: "target=queue:x\\x0auser=admin action=deljob" in open_console.log(), 10,
             message="the audit line, its newline escaped")
    assert not re.search(r"^(\S+ ){0,4}user=admin action=deljob", open_console.log(), re.M)
    audit = (open_console.workdir.parent / "open-data0" / "audit.log")
    text = audit.read_text() if audit.exists() else ""
    assert "user=admin action=deljob target=job:forged result=ok\n" not in text


def test_the_queue_pages_live_updates_do_not_reread_job_bodies(cluster, web) -> None:
    # The live part of /queues/<name> is its figures; the job browser's
    # JSCAN ... REPLY all (whole bodies, up to 512 MB each) belongs to the
    # page load only.  An active job: the browser lists it, the figures
    # (QSTAT, and QPEEK of the queued ones) do not read it.
    with node_client(cluster[0]) as c:
        job_id = c.add_job("live:bodies", b"y" * (1024 * 1024), replicate=1)
        assert c.dequeue(job_id) == 1

    def sent() -> int:
        total = 0
        for node in cluster:
            with node_client(node) as c:
                total += int(c.info()["stats"]["total_net_output_bytes"])
        return total

    try:
        before = sent()
        ticks = 0
        with web.stream("GET", "/events/queue/live:bodies") as stream:
            for line in stream.iter_lines():
                if line.startswith(": tick"):
                    ticks += 1
                    if ticks == 3:  # three updates
                        break
        assert sent() - before < 512 * 1024  # not the body once, let alone three times
    finally:
        with node_client(cluster[0]) as c:
            c.del_job(job_id)


def test_a_bad_overview_window_is_a_clear_message(web) -> None:
    reply = web.get("/api/overview", params={"window": "abc"})
    assert reply.status_code == 400 and "window must be a number" in reply.json()["error"]
    assert web.get("/api/overview", params={"window": "nan"}).status_code == 400
    assert web.get("/", params={"window": "abc"}).status_code == 400


def test_an_open_console_answers_only_requests_addressed_to_this_machine(
        cluster, open_console, console_factory) -> None:
    # DNS rebinding: a site whose name now resolves to 127.0.0.1 is the
    # console's own origin for the browser; its requests name that site.
    evil = {"Host": "attacker.example:7780"}
    with httpx.Client(base_url=open_console.url, timeout=30) as browser:
        refused = browser.get("/", headers=evil)
        assert refused.status_code == 403 and "--allowed-hosts" in refused.text
        assert "disque_console" not in refused.cookies
        assert browser.get("/api/queues", headers=evil).status_code == 403
        assert browser.get("/", headers={"Host": "localhost:7780"}).status_code == 200
        assert browser.get("/", headers={"Host": "[::1]:7780"}).status_code == 200
        assert browser.get("/").status_code == 200  # 127.0.0.1:<port>
    named = console_factory(cluster, "--allowed-hosts", "console.internal,Other.Example")
    with httpx.Client(base_url=named.url, timeout=30) as browser:
        assert browser.get("/", headers={"Host": "console.internal"}).status_code == 200
        assert browser.get("/", headers={"Host": "other.example:80"}).status_code == 200
        assert browser.get("/", headers=evil).status_code == 403


def test_queues_show_the_age_of_the_next_job_out_not_only_the_queues(cluster, web) -> None:
    # A queue three seconds old whose only job is new: QSTAT's age is the
    # queue's ("Queue age"); "Next job" is the job's, read for the page shown.
    with node_client(cluster[1]) as c:
        c.add_job("ages:q", b"first", replicate=1)
        c.ack(*[j.id for j in c.get_jobs("ages:q", nohang=True)])
        wait_for(lambda: c.qstat("ages:q")["age"] >= 3, 20, interval=0.2,
                 message="the queue to be 3 s old")
        c.add_job("ages:q", b"second", replicate=1)
        c.add_job("ages:empty", b"gone", replicate=1)
        c.ack(*[j.id for j in c.get_jobs("ages:empty", nohang=True)])
    (row,) = api(web, "/api/queues", pattern="ages:q", fresh=1)["queues"]
    assert row["age"] >= 3 and row["next_age"] is not None and row["next_age"] < 2, row
    (empty,) = api(web, "/api/queues", pattern="ages:empty")["queues"]
    assert empty["next_age"] is None
    page = web.get("/queues", params={"pattern": "ages:*"})
    assert "Queue age" in page.text and "Next job" in page.text
    assert re.search(r'<td class="next-age">[01]s</td>', page.text), page.text


def test_the_job_browser_reads_whole_only_the_jobs_it_shows(cluster, web) -> None:
    # Forty jobs of 256 KiB on one node: a page of two reads two bodies
    # (SHOW of the jobs shown), not every job its JSCAN call found.
    body = b"b" * (256 * 1024)
    with node_client(cluster[2]) as c:
        c.add_jobs("big:browse", [body] * 40, replicate=1)

        def sent() -> int:
            return int(c.info("stats")["stats"]["total_net_output_bytes"])

        before = sent()
        data = api(web, "/api/queues/big:browse", per_page=2)
        after = sent()
    assert len(data["browser"]["jobs"]) == 2
    assert all(j["size"] == len(body) for j in data["browser"]["jobs"])
    # Two bodies, the page's QPEEK of the next job and its SHOW: five at most.
    assert after - before < 5.5 * len(body), after - before


def test_the_console_runs_at_a_lower_cpu_priority(open_console) -> None:
    """--nice 10 by default: the console's work never comes before a node's."""
    assert open_console.proc is not None
    stat = Path(f"/proc/{open_console.proc.pid}/stat").read_text()
    nice = int(stat[stat.rindex(")") + 2:].split()[16])
    assert nice == min(19, os.nice(0) + 10), stat
