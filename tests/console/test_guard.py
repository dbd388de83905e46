"""What the console keeps and whom it lets in, over time: nodes that lose
their password, sessions (how many, how long), the data directory's modes,
and how often a user may have the queue table rebuilt.

Against real nodes; the console runs as its own process, except where it
must believe it serves outside loopback (``--bind 0.0.0.0``): that one runs
in this process (Starlette's test client), so that nothing listens beyond
127.0.0.1.
"""

from __future__ import annotations

import os
import re
import stat
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from disque.console.settings import Settings
from tests.console.conftest import ADMIN_PASSWORD, ConsoleProcess, api, csrf_of, login
from tests.support.process import DisqueProcess, wait_for

with warnings.catch_warnings():
    # Starlette's test client on httpx, which it now calls deprecated (it
    # runs the app in this process: nothing listens, whatever --bind says).
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


@pytest.fixture
def guarded_node(tmp_path: Path) -> Iterator[DisqueProcess]:
    """One node with a password, for a console that will see it lose it."""
    node = DisqueProcess(tmp_path / "guarded", "--requirepass", "guard-pw").start()
    try:
        yield node
    finally:
        node.kill()


def _exposed_console(node: DisqueProcess, probe_seconds: float = 30.0) -> TestClient:
    """The console as if it served 0.0.0.0 (in this process: nothing listens)."""
    from disque.console.web import create_app

    settings = Settings(nodes=(f"127.0.0.1:{node.port}",), bind="0.0.0.0",
                        probe_seconds=probe_seconds)
    return TestClient(create_app(settings), base_url="http://127.0.0.1:7780",
                      follow_redirects=False)


def _log_in(client: httpx.Client, user: str, password: str) -> httpx.Response:
    token = re.search(r'name="login_token" value="([^"]+)"', client.get("/login").text)
    assert token, "no login form"
    return client.post("/login", data={"login_token": token.group(1), "username": user,
                                       "password": password, "next": "/"})


def test_nodes_that_lose_their_password_close_a_console_bound_outside_loopback(
        guarded_node: DisqueProcess) -> None:
    # Checked every 0.2 s here (30 s by default).
    with _exposed_console(guarded_node, probe_seconds=0.2) as client:
        assert _log_in(client, "default", "guard-pw").headers["location"] == "/"
        assert client.get("/").status_code == 200
        guarded_node.client(password="guard-pw").execute_command("CONFIG", "SET",
                                                                 "requirepass", "")
        # The logged-in session is refused, saying why, as is everybody else.
        wait_for(lambda: client.get("/").status_code == 503, 10,
                 message="the console to notice the nodes are open")
        page = client.get("/nodes")
        assert page.status_code == 503 and "take no password now" in page.text
        assert "--allow-open" in page.text
        client.cookies.clear()
        for path in ("/", "/login", "/queues"):
            assert client.get(path).status_code == 503, path
        refused = client.get("/api/queues")
        assert refused.status_code == 503 and "take no password" in refused.json()["error"]
        assert client.get("/health").json()["refusing"] is True
        # Passwords again: served again.
        guarded_node.client().execute_command("CONFIG", "SET", "requirepass", "guard-pw")
        wait_for(lambda: client.get("/login").status_code == 200, 10,
                 message="the console to serve again")


def test_a_login_without_password_to_nodes_that_lost_it_gets_no_session(
        guarded_node: DisqueProcess) -> None:
    # Before the next check (30 s away), a visitor logs in as default without
    # a password, which the nodes now take: no session, the reason instead.
    with _exposed_console(guarded_node) as client:
        assert client.get("/login").status_code == 200
        guarded_node.client(password="guard-pw").execute_command("CONFIG", "SET",
                                                                 "requirepass", "")
        reply = _log_in(client, "default", "")
        assert reply.status_code == 303 and reply.headers["location"].startswith("/login?error=")
        assert "disque_console=" not in reply.headers.get("set-cookie", "")
        assert client.get("/").status_code == 503
        assert "take no password now" in client.get("/").text


def test_cookieless_requests_to_an_open_console_cannot_grow_its_sessions(
        open_console: ConsoleProcess) -> None:
    with httpx.Client(base_url=open_console.url, timeout=30) as first:
        token = csrf_of(first)
        assert csrf_of(first) == token  # the same session while it is kept
        # A script reading the API without a cookie gets no session.
        read = httpx.get(f"{open_console.url}/api/queues", params={"per_page": 1})
        assert read.status_code == 200 and "set-cookie" not in read.headers
        # A thousand visitors without a cookie (pages make a session each):
        # the least recently used anonymous sessions go, the first one too.
        with httpx.Client(base_url=open_console.url, timeout=30) as visitor:
            for _ in range(1000):
                visitor.cookies.clear()
                assert visitor.get("/jobs/x").status_code == 400
        assert csrf_of(first) != token  # a new session: the old one was let go


def test_a_session_ends_after_its_lifetime_however_busy(acl_cluster, console_factory) -> None:
    console = console_factory(acl_cluster, "--session-idle", "2", "--session-lifetime", "3")
    web = login(console.url, "default", ADMIN_PASSWORD)
    try:
        started = time.monotonic()
        # Used every 0.2 s, so never idle: still ends about 3 s after it began.
        wait_for(lambda: web.get("/api/nodes").status_code == 401, 20, interval=0.2,
                 message="the session's lifetime to end")
        assert time.monotonic() - started >= 2.5
    finally:
        web.close()


def test_the_data_directory_is_private_and_an_open_cookie_key_is_tightened(
        cluster, console_factory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "tasks").mkdir(parents=True)
    os.chmod(data, 0o755)
    os.chmod(data / "tasks", 0o755)
    (data / "cookie.key").write_bytes(os.urandom(32))
    (data / "history.jsonl").write_text("")
    (data / "tasks" / "old.jsonl").write_text("")
    for name in ("cookie.key", "history.jsonl", "tasks/old.jsonl"):
        os.chmod(data / name, 0o644)
    console = console_factory(cluster, "--data-dir", str(data))
    with httpx.Client(base_url=console.url, timeout=30) as web:
        web.get("/")
        web.headers["X-CSRF-Token"] = csrf_of(web)
        reply = web.post("/api/actions/bulk", json={"op": "delete", "queue": "private:none"})
        assert reply.status_code == 202
        task = reply.json()["id"]
        wait_for(lambda: api(web, f"/api/tasks/{task}")["state"] == "finished", 20,
                 message="the task to end")

    def mode(name: str) -> int:
        return stat.S_IMODE((data / name).stat().st_mode)

    assert mode("") == 0o700 and mode("tasks") == 0o700
    for name in ("cookie.key", "history.jsonl", "tasks/old.jsonl", "audit.log",
                 f"tasks/{task}.jsonl"):
        assert mode(name) == 0o600, (name, oct(mode(name)))


def test_asking_for_a_fresh_queue_table_again_and_again_keeps_the_spacing(
        open_console: ConsoleProcess) -> None:
    # A rebuild no sooner than 2 s (the table's usual age) after the last:
    # three fresh tables in a row take 4 s at least, not three rebuilds at once.
    with httpx.Client(base_url=open_console.url, timeout=30) as web:
        api(web, "/api/queues", fresh=1)
        started = time.monotonic()
        for _ in range(2):
            data = api(web, "/api/queues", fresh=1)
            assert data["table_age"] < 1.0
        assert time.monotonic() - started >= 3.5
