"""Redrive and bulk actions through the console's API, against a real 3-node cluster.

Each "none lost, none duplicated" check counts what a real consumer
received while the task ran.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.console.conftest import ConsoleProcess, api, csrf_of
from tests.console.workload import (
    Consumer,
    assert_each_once,
    jobs_left,
    make_dead_letters,
    node_client,
    queue_length,
)
from tests.support.process import DisqueProcess, wait_for


@pytest.fixture
def web(open_console: ConsoleProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=open_console.url, timeout=30) as client:
        assert client.get("/").status_code == 200
        client.headers["X-CSRF-Token"] = csrf_of(client)
        yield client


def start(web: httpx.Client, kind: str, **values: Any) -> dict[str, Any]:
    reply = web.post(f"/api/actions/{kind}", json=values)
    assert reply.status_code == 202, reply.text
    return reply.json()


def finished(web: httpx.Client, task_id: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        task = api(web, f"/api/tasks/{task_id}")
        return task if task["state"] not in ("waiting", "running", "paused") else None

    return wait_for(done, timeout, interval=0.1, message=f"task {task_id} to end")


def test_redrive_while_a_consumer_runs_loses_and_duplicates_nothing(
        cluster: list[DisqueProcess], web: httpx.Client, open_console: ConsoleProcess) -> None:
    bodies = [f"rd-{n}-{i}".encode() for n in range(3) for i in range(80)]
    for n, node in enumerate(cluster):
        make_dead_letters(node, "rd:orders", bodies[n * 80:(n + 1) * 80])
    assert queue_length(cluster, "rd:orders:dead") == 240
    consumer = Consumer(cluster, "rd:orders").start()
    try:
        task = start(web, "redrive", queue="rd:orders:dead", rate=300)
        assert task["kind"] == "redrive" and task["state"] in ("waiting", "running")
        # Progress while it runs: counters only grow.
        seen = wait_for(lambda: api(web, f"/api/tasks/{task['id']}")["counts"]["done"], 30,
                        interval=0.05, message="the first moves")
        task = finished(web, task["id"])
        assert task["state"] == "finished", task
        assert task["counts"]["done"] == 240 >= seen and task["counts"]["failed"] == 0
        assert task["counts"]["total"] == 240 and task["percent"] == 100
        wait_for(lambda: consumer.received() >= 240, 60,
                 message=lambda: f"240 jobs consumed, got {consumer.received()}")
        wait_for(lambda: jobs_left(cluster, "rd:orders", "rd:orders:dead") == 0, 30,
                 message=lambda: "no job left on the nodes, "
                                 f"{jobs_left(cluster, 'rd:orders', 'rd:orders:dead')} are")
    finally:
        received = consumer.stop()
    assert_each_once(received, bodies)
    assert queue_length(cluster, "rd:orders:dead") == 0
    wait_for(lambda: re.search(
        rf"user=default action=redrive target=queue:rd:orders:dead to=<origin> rate=300 "
        rf"task={task['id']} result=ok \(moved 240\)", open_console.log()), 10,
        message="the redrive's audit line")
    listed = api(web, "/api/tasks")["tasks"]
    assert task["id"] in [t["id"] for t in listed]


def test_a_task_pauses_resumes_and_cancels(cluster, web) -> None:
    make_dead_letters(cluster[1], "ctl", [f"c{i}".encode() for i in range(60)])
    task = start(web, "redrive", queue="ctl:dead", rate=10)
    wait_for(lambda: api(web, f"/api/tasks/{task['id']}")["counts"]["done"] >= 2, 20,
             message="the first moves")
    paused = web.post("/api/actions/task", json={"id": task["id"], "op": "pause"})
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    # Paused: no more moves (within a batch already under way).
    done = api(web, f"/api/tasks/{task['id']}")["counts"]["done"]
    with node_client(cluster[1]) as c:
        still = c.qlen("ctl:dead")
    assert api(web, f"/api/tasks/{task['id']}")["state"] == "paused"
    resumed = web.post("/api/actions/task", json={"id": task["id"], "op": "resume"})
    assert resumed.status_code == 200 and resumed.json()["state"] == "running"
    wait_for(lambda: api(web, f"/api/tasks/{task['id']}")["counts"]["done"] > done + 1, 20,
             message="moves after the resume")
    cancel = web.post("/api/actions/task", json={"id": task["id"], "op": "cancel"})
    assert cancel.status_code == 200
    ended = finished(web, task["id"])
    assert ended["state"] == "cancelled" and ended["in_flight"] == 0
    with node_client(cluster[1]) as c:
        left = c.qlen("ctl:dead")
        assert c.qlen("ctl") + left == 60 and 0 < left < still
    again = web.post("/api/actions/task", json={"id": task["id"], "op": "pause"})
    assert again.status_code == 409  # a cancelled task cannot be paused


def test_bulk_enqueue_dequeue_delete_and_move_over_a_filter(cluster, web) -> None:
    with node_client(cluster[0]) as c:
        ids = c.add_jobs("bulk:src", [f"red-{i}".encode() for i in range(20)]
                         + [f"blue-{i}".encode() for i in range(20)], retry=300)
        # Ten delivered (active): enqueue puts back those the filter names.
        delivered = c.get_jobs("bulk:src", count=10, nohang=True)
    assert len(delivered) == 10
    task = finished(web, start(web, "bulk", op="enqueue", queue="bulk:src", state="active",
                               rate=500)["id"])
    assert task["counts"]["done"] == 10 and task["state"] == "finished"
    assert queue_length(cluster, "bulk:src") == 40
    # Move the red ones, five at most.
    task = finished(web, start(web, "bulk", op="move", queue="bulk:src", to="bulk:dst",
                               contains="red", limit=5, rate=500)["id"])
    assert task["counts"]["done"] == 5, task
    with node_client(cluster[0]) as c:
        moved = [j for j in c.jscan(queue="bulk:dst", reply="all")]
    assert len(moved) == 5 and all(j["body"].startswith(b"red-") for j in moved)
    assert queue_length(cluster, "bulk:src") == 35
    # Dequeue the blue ones: they stay, active, out of the queue.
    task = finished(web, start(web, "bulk", op="dequeue", queue="bulk:src", contains="blue",
                               rate=500)["id"])
    assert task["counts"]["done"] == 20 and queue_length(cluster, "bulk:src") == 15
    # Delete every job of the queue, on every node holding a copy.
    task = finished(web, start(web, "bulk", op="delete", queue="bulk:src", rate=1000)["id"])
    assert task["counts"]["done"] == 35, task
    for node in cluster:
        with node_client(node) as c:
            assert not any(c.show(i) for i in ids if i not in {j["id"] for j in moved})


def test_bulk_input_is_checked_and_forms_need_csrf_and_confirmation(cluster, web) -> None:
    for values, words in (({"op": "move", "queue": "x"}, "a move needs the queue"),
                          ({"op": "drop", "queue": "x"}, "the action must be one of"),
                          ({"op": "delete", "queue": "x", "rate": "fast"},
                           "rate must be a number"),
                          ({"op": "delete", "queue": "x", "rate": "100000"},
                           "rate must be between"),
                          ({"op": "move", "queue": "x", "to": "y", "state": "active"},
                           "only queued jobs can be moved"),
                          ({"op": "enqueue", "queue": ""}, "name the queue")):
        reply = web.post("/api/actions/bulk", json=values)
        assert reply.status_code == 400 and words in reply.json()["error"], reply.text
    with node_client(cluster[2]) as c:
        c.add_job("bulk:form", b"x")
    token = web.headers["X-CSRF-Token"]
    form = {"action": "bulk", "op": "delete", "queue": "bulk:form", "back": "/queues/bulk:form"}
    assert web.post("/actions", data=form).status_code == 403  # no token
    asked = web.post("/actions", data={**form, "csrf": token})
    assert asked.status_code == 200 and 'id="confirm"' in asked.text
    assert "delete" in asked.text and "bulk:form" in asked.text
    assert queue_length(cluster, "bulk:form") == 1  # nothing done before the confirmation
    done = web.post("/actions", data={**form, "csrf": token, "confirm": "yes"})
    assert done.status_code == 303
    page = web.get("/queues/bulk:form")
    assert "delete of bulk:form started" in page.text and 'id="live-tasks"' in page.text
    wait_for(lambda: queue_length(cluster, "bulk:form") == 0, 20, message="the delete")
    assert web.get("/api/tasks/nope").status_code == 404


def test_tasks_are_private_to_their_user(acl_cluster, console_factory) -> None:
    from tests.console.conftest import ADMIN_PASSWORD, login

    with node_client(acl_cluster[0], password=ADMIN_PASSWORD) as c:
        c.add_job("team-b:jobs", b"b")
    console = console_factory(acl_cluster)
    team_a = login(console.url, "team-a", "team-a-pw")
    admin = login(console.url, "default", ADMIN_PASSWORD)
    try:
        token = csrf_of(team_a)
        # Another team's queue: the nodes refuse, the task says so and fails.
        refused = team_a.post("/api/actions/bulk", json={"op": "delete", "queue": "team-b:jobs"},
                              headers={"X-CSRF-Token": token})
        assert refused.status_code == 202
        ended = finished(team_a, refused.json()["id"])
        assert ended["state"] == "failed" and any("NOPERM" in p for p in ended["problems"])
        assert queue_length_as(acl_cluster, "team-b:jobs") == 1
        # The admin does not see team-a's tasks, nor may it steer them.
        assert api(admin, "/api/tasks")["tasks"] == []
        assert admin.get(f"/api/tasks/{ended['id']}").status_code == 404
    finally:
        team_a.close()
        admin.close()


def queue_length_as(nodes: list[DisqueProcess], queue: str) -> int:
    from tests.console.conftest import ADMIN_PASSWORD

    total = 0
    for node in nodes:
        with node_client(node, password=ADMIN_PASSWORD) as c:
            total += c.qlen(queue)
    return total


def test_an_interrupted_redrive_resumes_after_a_console_restart(cluster, console_factory,
                                                                tmp_path) -> None:
    bodies = [f"restart-{i}".encode() for i in range(120)]
    make_dead_letters(cluster[2], "rs", bodies)
    data_dir = tmp_path / "data"
    console = console_factory(cluster, "--data-dir", str(data_dir))
    with httpx.Client(base_url=console.url, timeout=30) as web:
        web.get("/")
        web.headers["X-CSRF-Token"] = csrf_of(web)
        task = start(web, "redrive", queue="rs:dead", rate=40)
        wait_for(lambda: api(web, f"/api/tasks/{task['id']}")["counts"]["done"] >= 20, 30,
                 message="20 moves")
    console.stop()  # SIGTERM while the redrive runs
    moved_before = queue_length(cluster, "rs")
    assert 0 < moved_before < 120
    again = console_factory(cluster, "--data-dir", str(data_dir), name="again")
    consumer = Consumer(cluster, "rs").start()
    try:
        with httpx.Client(base_url=again.url, timeout=30) as web:
            web.get("/")
            web.headers["X-CSRF-Token"] = csrf_of(web)
            shown = api(web, f"/api/tasks/{task['id']}")
            assert shown["state"] == "interrupted" and shown["counts"]["done"] >= 20
            assert "Resume" in web.get("/dead-letters").text
            resumed = web.post("/api/actions/task", json={"id": task["id"], "op": "resume"})
            assert resumed.status_code == 200, resumed.text
            ended = finished(web, task["id"])
            assert ended["state"] == "finished" and ended["counts"]["failed"] == 0
        wait_for(lambda: consumer.received() >= 120, 60,
                 message=lambda: f"120 consumed, got {consumer.received()}")
        wait_for(lambda: jobs_left(cluster, "rs", "rs:dead") == 0, 30, message="no job left")
    finally:
        received = consumer.stop()
    assert_each_once(received, bodies)


def test_the_overview_charts_jobs_added_delivered_and_acked(cluster, web) -> None:
    with node_client(cluster[0]) as c:
        ids = c.add_jobs("charted", [b"x"] * 30)
        c.ack(*[j.id for j in c.get_jobs("charted", count=30, nohang=True)])
    assert ids

    def charted() -> dict[str, Any] | None:
        charts = api(web, "/api/overview")["charts"] or {}
        if all(any(v > 0 for _, v in charts.get(k, {}).get("points", []))
               for k in ("added", "delivered", "acked")):
            return charts
        return None

    charts = wait_for(charted, 20, interval=0.2, message="non-zero add/deliver/ACK rates")
    assert charts["added"]["label"] == "added /s"
    overview = api(web, "/api/overview")
    assert overview["job_rates"] and overview["uncounted"] == []
    history = api(web, "/api/history", series="added_jobs")
    assert len(history["nodes"]) == 3
    assert 'id="chart-flow"' in web.get("/").text


class Staller:
    """A thread that keeps ``node`` in ``DEBUG SLEEP``, ``seconds`` at a time
    with ``gap`` between (0: back to back, the node doing a little of its
    work between two): the copies an ADDJOB waits for come late."""

    def __init__(self, node: DisqueProcess, seconds: float, gap: float = 0.0) -> None:
        self.node = node
        self.seconds = seconds
        self.gap = gap
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with node_client(self.node, socket_timeout=30) as c:
            while not self._stop.is_set():
                c.execute_command("DEBUG", "SLEEP", str(self.seconds))
                if self.gap:
                    self._stop.wait(self.gap)

    def __enter__(self) -> Staller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.parametrize("stall,gap,rate", [(0.4, 0.0, 600), (0.8, 0.4, 100)],
                         ids=["within-the-hold", "past-the-hold"])
def test_a_move_holds_its_claims_so_no_job_is_delivered_twice(cluster, web, stall, gap,
                                                              rate) -> None:
    # RETRY 1: a claimed job that nothing holds is queued again within about
    # a second.  A stalled third node makes each ADDJOB wait for its copy,
    # up to ``stall``: within the hold (0.7 s), or past it, when the ADDJOB
    # times out and is sent again at a later batch, its claim held
    # meanwhile.  A consumer of the source queue starts as soon as the move
    # has claimed every job: it gets only what is queued again, and each
    # such job is one the move adds to the target as well, unless held.
    # One copy each (REPLICATE 1): no copy on the stalled node, whose own
    # timers, late after a stall, could queue a job again (the node's
    # at-least-once, not the move's doing).
    source, target = f"hold-{stall}:src", f"hold-{stall}:dst"
    bodies = [f"hold-{stall}-{i}".encode() for i in range(60)]
    with node_client(cluster[0]) as c:
        # Added over a second: their requeue times (RETRY after their
        # creation, then every RETRY while queued) fall anywhere in it.
        for group in range(10):
            c.add_jobs(source, bodies[group * 6:(group + 1) * 6], retry=1, ttl=3600,
                       replicate=1)
            time.sleep(0.1)  # spacing the creation times, not waiting for anything
    takers = [Consumer(cluster, target).start()]
    try:
        with Staller(cluster[2], stall, gap), node_client(cluster[0]) as c:
            task = start(web, "bulk", op="move", queue=source, to=target, rate=rate)
            wait_for(lambda: c.qlen(source) == 0, 30, interval=0.002,
                     message="the move to claim every job")
            takers.append(Consumer(cluster, source).start())
            task = finished(web, task["id"], timeout=120)
        assert task["state"] == "finished" and task["counts"]["failed"] == 0, task
        wait_for(lambda: sum(t.received() for t in takers) >= len(bodies)
                 and jobs_left(cluster, source, target) == 0, 60,
                 message=lambda: f"{len(bodies)} consumed, got "
                                 f"{sum(t.received() for t in takers)}")
    finally:
        received = Counter[bytes]()
        for taker in takers:
            received.update(taker.stop())
    assert_each_once(received, bodies)
    assert task["counts"]["done"] == len(bodies), task


def test_the_walk_is_paced_even_when_the_filter_matches_little(cluster, web) -> None:
    # A filter that matches one job in 4,000: the task acts on one job, but
    # its walk (JSCAN ... REPLY all, bodies included) examines all of them;
    # at rate 10 it may examine SCAN_FLOOR (2,000) a second, so it takes
    # two seconds at least, instead of back-to-back scans.
    with node_client(cluster[1]) as c:
        c.add_jobs("pace", [b"hay"] * 3999 + [b"needle"], replicate=1, retry=300)
    started = time.monotonic()
    task = finished(web, start(web, "bulk", op="delete", queue="pace", contains="needle",
                               rate=10)["id"], timeout=60)
    elapsed = time.monotonic() - started
    assert task["state"] == "finished" and task["counts"]["done"] == 1, task
    assert task["counts"]["examined"] == 4000 and task["counts"]["total"] == 4000, task
    assert elapsed >= 2.0, elapsed
    with node_client(cluster[1]) as c:
        assert c.qlen("pace") == 3999
        c.execute_command("DELJOB", *[j for j in c.jscan(queue="pace")])


def test_one_user_cannot_take_every_task_slot(acl_cluster, console_factory) -> None:
    from tests.console.conftest import ADMIN_PASSWORD, login

    with node_client(acl_cluster[0], password=ADMIN_PASSWORD) as c:
        for team in ("team-a", "team-b"):
            c.add_jobs(f"{team}:slow", [b"x"] * 10, retry=300)
    console = console_factory(acl_cluster)
    teams = {team: login(console.url, team, f"{team}-pw") for team in ("team-a", "team-b")}
    started: list[tuple[str, str]] = []
    try:
        def slow(team: str) -> str:
            web = teams[team]
            reply = web.post("/api/actions/bulk", json={"op": "dequeue", "queue": f"{team}:slow",
                                                        "rate": "0.1"},
                             headers={"X-CSRF-Token": csrf_of(web)})
            assert reply.status_code == 202, reply.text
            started.append((team, reply.json()["id"]))
            return str(reply.json()["id"])

        def state(team: str, task_id: str) -> str:
            return str(api(teams[team], f"/api/tasks/{task_id}")["state"])

        # Five tasks of team-a: two run, the other three wait (the console
        # runs four at once in all).
        mine = [slow("team-a") for _ in range(5)]
        wait_for(lambda: [state("team-a", t) for t in mine[:2]] == ["running"] * 2, 20,
                 message="team-a's first two tasks to run")
        assert [state("team-a", t) for t in mine[2:]] == ["waiting"] * 3
        # team-b's task does not wait behind them.
        other = slow("team-b")
        wait_for(lambda: state("team-b", other) == "running", 20,
                 message="team-b's task to run")
        # One of team-a's ends: the next one of team-a's takes its place.
        cancel = teams["team-a"].post("/api/actions/task", json={"id": mine[0], "op": "cancel"},
                                      headers={"X-CSRF-Token": csrf_of(teams["team-a"])})
        assert cancel.status_code == 200
        wait_for(lambda: state("team-a", mine[2]) == "running", 20,
                 message="team-a's third task to run")
        assert [state("team-a", t) for t in mine[3:]] == ["waiting"] * 2
    finally:
        for team, task_id in started:
            teams[team].post("/api/actions/task", json={"id": task_id, "op": "cancel"},
                             headers={"X-CSRF-Token": csrf_of(teams[team])})
        for web in teams.values():
            web.close()
