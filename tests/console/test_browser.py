"""End to end in a real browser: Debian's Chromium driven by Playwright for Python.

Playwright's own browser download cannot work on these machines, so the
tests launch ``/usr/bin/chromium`` (``apt-get install chromium``; .ci/run
installs it) and skip, saying so, where it is missing.  Every page's
JavaScript errors and console errors are collected and must be none.

Screenshots of each page are saved in the test's directory; with
``DISQUE_CONSOLE_SCREENSHOTS=docs`` they are also copied to
``docs/console-*.png`` (how the docs' pictures are made).
"""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from disque import Client
from tests.console.conftest import ADMIN_PASSWORD
from tests.console.workload import (
    Consumer,
    assert_each_once,
    make_dead_letters,
    node_client,
)
from tests.support.process import wait_for

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="needs Playwright for Python (dev extra)")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason="needs Debian's Chromium: apt-get install chromium (.ci/run installs it)")
DOCS = Path(__file__).resolve().parents[2] / "docs"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class Browser:
    """One Chromium, its pages' errors, and the screenshots taken."""

    def __init__(self, playwright, shots: Path) -> None:
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        self.errors: list[str] = []
        self.shots = shots
        #: The confirmations the pages asked for (each accepted).
        self.dialogs: list[str] = []

    def page(self):
        context = self.browser.new_context(viewport={"width": 1280, "height": 820})
        page = context.new_page()
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.accept()))
        page.set_default_timeout(20_000)
        return page

    def shot(self, page, name: str) -> None:
        path = self.shots / f"console-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if os.environ.get("DISQUE_CONSOLE_SCREENSHOTS") == "docs":
            shutil.copy(path, DOCS / path.name)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    with sync_api.sync_playwright() as playwright:
        driven = Browser(playwright, tmp_path)
        try:
            yield driven
        finally:
            driven.browser.close()
    assert driven.errors == [], driven.errors


def log_in(page, url: str, user: str, password: str) -> None:
    page.goto(f"{url}/login")
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login")
    page.wait_for_selector("#user")
    assert page.inner_text("#user") == user


def length_on_page(page) -> int:
    cell = page.query_selector('tr[data-queue="shop:orders"] td.qlen')
    return int(cell.inner_text()) if cell else -1


def test_operator_session_end_to_end(acl_cluster, console_factory, browser) -> None:
    console = console_factory(acl_cluster, "--sample-user", "default",
                              env={"DISQUE_CONSOLE_SAMPLE_PASSWORD": ADMIN_PASSWORD})
    page = browser.page()
    log_in(page, console.url, "default", ADMIN_PASSWORD)
    page.wait_for_selector("#nodes-table tbody tr:nth-child(3)")

    # A producer runs while the queues page is open: the length grows on screen.
    page.goto(f"{console.url}/queues?pattern=shop:*")
    stop = threading.Event()

    def produce() -> None:
        with Client(f"127.0.0.1:{acl_cluster[0].port}", password=ADMIN_PASSWORD) as c:
            for i in range(400):
                if stop.is_set():
                    return
                c.add_job("shop:orders", f'{{"order": {i}, "sku": "A-{i % 7}"}}'.encode(),
                          retry=60)
                stop.wait(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        first = wait_for(lambda: length_on_page(page) > 0 and length_on_page(page), 30,
                         message="the queue to show up while the producer runs")
        wait_for(lambda: length_on_page(page) > first, 30,
                 message="the queue's length to grow on the page (live update)")
        browser.shot(page, "queues")
    finally:
        stop.set()
        producer.join()

    # Open a job (one delivered to a worker, so a NACK puts it back) and NACK it.
    with Client(f"127.0.0.1:{acl_cluster[0].port}", password=ADMIN_PASSWORD) as c:
        job = c.get_job("shop:orders", nohang=True)
        assert job is not None
    page.goto(f"{console.url}/queues/shop:orders")
    page.wait_for_selector("#jobs-table a.job-link")
    page.fill("#qlimit-max", "50")
    page.fill("#qlimit-period", "1000")
    page.click("#qlimit-set")
    page.wait_for_selector(".flash.ok")
    assert page.inner_text("#queue-limit") == "50/1000ms"
    browser.shot(page, "queue")
    page.goto(f"{console.url}/jobs/{quote(job.id, safe='')}")
    assert page.inner_text("#job-state") == "active"
    assert "JSON" in page.inner_text("[data-tabs]")
    page.click('[data-tab="hex"]')
    assert page.is_visible("#body-hex") and not page.is_visible("#body-json")
    page.click('[data-tab="json"]')
    page.click("#job-nack")
    page.wait_for_selector(".flash.ok")
    assert f"nack job:{job.id}: done (1)" in page.inner_text(".flash.ok")
    wait_for(lambda: "1" in page.inner_text("#job-copies td.nacks"), 20,
             message="the NACK counted on the page")
    browser.shot(page, "job")

    # Pause the queue: the browser asks first (the dialog is accepted).
    page.goto(f"{console.url}/queues/shop:orders")
    page.click("#pause-in")
    page.wait_for_selector(".flash.ok")
    assert page.inner_text("#queue-pause") == "in"
    for node in acl_cluster:
        with Client(f"127.0.0.1:{node.port}", password=ADMIN_PASSWORD,
                    randomize=False) as c:
            assert c.pause("shop:orders") == "in"
    page.click("#pause-none")
    page.wait_for_selector("#queue-pause:text('none')")

    page.goto(f"{console.url}/nodes")
    page.wait_for_selector("article.node")
    browser.shot(page, "nodes")
    page.goto(f"{console.url}/dead-letters")
    browser.shot(page, "dead-letters")
    page.goto(f"{console.url}/")
    page.wait_for_selector("svg#chart-commands polyline")  # the history chart drew
    browser.shot(page, "overview")


def test_a_restricted_user_sees_noperm_for_another_teams_queue(acl_cluster, console_factory,
                                                               browser) -> None:
    with Client(f"127.0.0.1:{acl_cluster[0].port}", password=ADMIN_PASSWORD) as c:
        c.add_job("team-b:payroll", b"salary")
        c.add_job("team-a:orders", b"order")
    console = console_factory(acl_cluster)
    page = browser.page()
    page.goto(f"{console.url}/queues/team-b:payroll")
    page.wait_for_selector("#login")  # not logged in: the login form
    browser.shot(page, "login")
    log_in(page, console.url, "team-a", "team-a-pw")
    page.goto(f"{console.url}/queues?pattern=team-*")
    page.wait_for_selector('tr[data-queue="team-a:orders"]')
    assert page.query_selector('tr[data-queue="team-b:payroll"]') is None
    page.goto(f"{console.url}/queues/team-b:payroll")
    text = page.inner_text("#noperm")
    assert "NOPERM" in text and "team-b:payroll" in text
    browser.shot(page, "noperm")


def test_a_cross_site_form_and_a_missing_token_change_nothing(acl_cluster, console_factory,
                                                              browser, tmp_path) -> None:
    console = console_factory(acl_cluster)
    page = browser.page()
    log_in(page, console.url, "default", ADMIN_PASSWORD)
    page.goto(f"{console.url}/queues/csrf:target")
    token = page.get_attribute('input[name="csrf"]', "value")
    # Same origin but no token: refused.
    status = page.evaluate("""async () => (await fetch('/actions', {method: 'POST',
        headers: {'Content-Type': 'application/x-www-form-urlencoded'},
        body: 'action=pause&queue=csrf:target&state=all&confirm=yes'})).status""")
    assert status == 403
    # The browser logs that refusal as a failed resource: expected here, and only here.
    refused = [e for e in browser.errors if "status of 403" in e]
    assert len(refused) == 1
    browser.errors.remove(refused[0])
    # Another site (localhost is not 127.0.0.1's site) posting with even the
    # right token: the SameSite=Strict cookie is not sent, so no session acts.
    attack = tmp_path / "attack"
    attack.mkdir()
    port = console.url.rsplit(":", 1)[1]
    (attack / "index.html").write_text(f"""<!doctype html><form id=f method=post
        action="http://127.0.0.1:{port}/actions"><input name=csrf value="{token}">
        <input name=action value=pause><input name=queue value="csrf:target">
        <input name=state value=all><input name=confirm value=yes></form>
        <script>document.getElementById('f').submit()</script>""")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(attack)))
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        page.goto(f"http://localhost:{server.server_address[1]}/index.html")
        page.wait_for_url("**/login**")  # arrived without a session: asked to log in
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
    for node in acl_cluster:
        with Client(f"127.0.0.1:{node.port}", password=ADMIN_PASSWORD,
                    randomize=False) as c:
            assert c.pause("csrf:target") == "none"
    page.goto(f"{console.url}/")
    assert page.inner_text("#user") == "default"  # the real session still works


def task_row(page) -> dict[str, str] | None:
    """The first task of the page's table, as the last server-sent update drew it."""
    row = page.query_selector("#live-tasks tr[data-task]")
    if row is None:
        return None
    bar = row.query_selector("progress.task-progress")
    return {"state": row.query_selector(".task-state").inner_text(),
            "done": row.query_selector(".task-done").inner_text(),
            "percent": bar.get_attribute("value") if bar else ""}


def test_redrive_dead_letters_while_a_consumer_runs(acl_cluster, console_factory,
                                                    browser) -> None:
    bodies = [f'{{"payment": {i}}}'.encode() for i in range(150)]
    for n, node in enumerate(acl_cluster):
        make_dead_letters(node, "shop:payments", bodies[n * 50:(n + 1) * 50],
                          password=ADMIN_PASSWORD)
    console = console_factory(acl_cluster)
    page = browser.page()
    log_in(page, console.url, "default", ADMIN_PASSWORD)
    page.goto(f"{console.url}/dead-letters")
    page.wait_for_selector('#dead-table a.redrive-link')
    page.click('#dead-table a.redrive-link')
    assert page.input_value("#redrive-queue") == "shop:payments:dead"
    page.fill("#redrive-rate", "40")
    consumer = Consumer(acl_cluster, "shop:payments", password=ADMIN_PASSWORD).start()
    try:
        page.click("#redrive-start")
        page.wait_for_selector(".flash.ok")
        assert "redrive of shop:payments:dead started" in page.inner_text(".flash.ok")
        assert browser.dialogs[-1].startswith("Move the jobs of this dead-letter queue")
        # The progress moves on the page while the redrive runs (server-sent events).
        running = wait_for(lambda: (r := task_row(page)) and r["state"] == "running"
                           and 0 < float(r["percent"]) < 100 and r, 30, interval=0.05,
                           message="the redrive's progress on the page")
        browser.shot(page, "redrive")
        wait_for(lambda: (r := task_row(page)) and r["state"] == "finished", 60,
                 message=lambda: f"the redrive to finish on the page: {task_row(page)}")
        assert task_row(page) == {"state": "finished", "done": "150", "percent": "100.0"}
        assert int(running["done"]) < 150
        wait_for(lambda: consumer.received() >= 150, 60,
                 message=lambda: f"150 consumed, got {consumer.received()}")
        wait_for(lambda: jobs_left_as_admin(acl_cluster) == 0, 30, message="no job left")
    finally:
        received = consumer.stop()
    assert_each_once(received, bodies)
    # A fresh queue table: the dead-letter queue is empty (or gone) on every node.
    page.goto(f"{console.url}/dead-letters?fresh=1")
    row = page.query_selector('#dead-table tr:has(a[href="/queues/shop%3Apayments%3Adead"])')
    assert row is None or row.query_selector("td.num").inner_text() == "0"


def jobs_left_as_admin(nodes) -> int:
    total = 0
    for node in nodes:
        with node_client(node, password=ADMIN_PASSWORD) as c:
            for queue in ("shop:payments", "shop:payments:dead"):
                total += sum(1 for _ in c.jscan(queue=queue))
    return total


def test_bulk_move_with_confirmation_progress_and_audit(acl_cluster, console_factory,
                                                        browser, tmp_path) -> None:
    with Client(f"127.0.0.1:{acl_cluster[0].port}", password=ADMIN_PASSWORD) as c:
        c.add_jobs("shop:returns", [f"return-{i}".encode() for i in range(60)]
                   + [f"exchange-{i}".encode() for i in range(20)], retry=120)
    data_dir = tmp_path / "data"
    console = console_factory(acl_cluster, "--data-dir", str(data_dir))
    page = browser.page()
    log_in(page, console.url, "default", ADMIN_PASSWORD)
    page.goto(f"{console.url}/queues/shop:returns")
    page.select_option("#bulk-op", "move")
    page.fill("#bulk-contains", "return-")
    page.fill("#bulk-to", "shop:returns-archive")
    page.fill("#bulk-rate", "30")
    page.click("#bulk-start")
    page.wait_for_selector(".flash.ok")
    assert browser.dialogs[-1] == ("Run this bulk action on every matching job of "
                                   "shop:returns?")
    wait_for(lambda: (r := task_row(page)) and r["state"] == "running"
             and 0 < float(r["percent"]) < 100, 30, interval=0.05,
             message="the move's progress on the page")
    browser.shot(page, "bulk")
    wait_for(lambda: (r := task_row(page)) and r["state"] == "finished", 60,
             message=lambda: f"the move to finish on the page: {task_row(page)}")
    row = task_row(page)
    assert row is not None and row["done"] == "60"
    assert queue_length_as_admin(acl_cluster, "shop:returns-archive") == 60
    assert queue_length_as_admin(acl_cluster, "shop:returns") == 20
    audit = (data_dir / "audit.log").read_text()
    assert "user=default action=move target=queue:shop:returns to=shop:returns-archive " \
           "contains='return-' rate=30" in audit
    assert "result=ok (moved 60, not matching 20)" in audit


def queue_length_as_admin(nodes, queue: str) -> int:
    total = 0
    for node in nodes:
        with node_client(node, password=ADMIN_PASSWORD) as c:
            total += c.qlen(queue)
    return total
