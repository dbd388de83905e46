"""Fixtures for the console: real nodes, a real ``disque-console`` process, HTTP clients.

The console runs as users run it (``python -m disque.console``, its own
process, port 0); tests talk to it over HTTP like a browser or a script.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
pytest.importorskip("uvicorn", reason="the console needs the 'console' extra")
httpx = pytest.importorskip("httpx", reason="the console tests call it with httpx (dev extra)")

from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined  # noqa: E402
from tests.support.console import ConsoleProcess  # noqa: E402
from tests.support.process import DisqueProcess, wait_for  # noqa: E402

__all__ = ["ADMIN_PASSWORD", "ConsoleProcess", "api", "csrf_of", "login"]
ADMIN_PASSWORD = "console-admin-pw"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DisqueProcess]]:
    """Three of our nodes, joined, without passwords (an open cluster)."""
    base = tmp_path_factory.mktemp("open-cluster")
    nodes = [DisqueProcess(base / f"n{i}", "--cluster-node-timeout",
                           str(TEST_NODE_TIMEOUT_MS)).start() for i in range(3)]
    try:
        join(nodes)
        wait_joined(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.kill()


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DisqueProcess]]:
    """Three joined nodes with passwords: ``default`` (admin) and two teams'
    users, each limited to its own queues (``team-a:*``, ``team-b:*``)."""
    base = tmp_path_factory.mktemp("acl-cluster")
    nodes = [DisqueProcess(base / f"n{i}", "--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS),
                           "--requirepass", ADMIN_PASSWORD).start() for i in range(3)]
    try:
        for node in nodes:
            admin = node.client(password=ADMIN_PASSWORD)
            for team in ("team-a", "team-b"):
                admin.execute_command("ACL", "SETUSER", team, "on", f">{team}-pw",
                                      f"~{team}:*", "+@read", "+@write")
        for node in nodes[1:]:
            nodes[0].client(password=ADMIN_PASSWORD).execute_command(
                "CLUSTER", "MEET", "127.0.0.1", node.port)

        def joined() -> bool:
            for node in nodes:
                text = node.client(password=ADMIN_PASSWORD).execute_command(
                    "CLUSTER", "NODES").decode()
                if text.count(" connected") != 3 or "handshake" in text or "fail" in text:
                    return False
            return True

        wait_for(joined, 20, message="the password-protected nodes to join")
        yield nodes
    finally:
        for node in nodes:
            node.kill()


@pytest.fixture
def console_factory(tmp_path: Path) -> Iterator[Callable[..., ConsoleProcess]]:
    started: list[ConsoleProcess] = []

    def start(nodes: list[DisqueProcess], *args: str, name: str = "console",
              env: dict[str, str] | None = None) -> ConsoleProcess:
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in nodes)
        console = ConsoleProcess(tmp_path / name, "--nodes", seeds, *args)
        started.append(console)
        return console.start(env)

    yield start
    for console in started:
        console.stop()


def login(url: str, user: str, password: str) -> httpx.Client:
    """An HTTP client with a session cookie, logged in through the login form."""
    client = httpx.Client(base_url=url, timeout=30)
    page = client.get("/login")
    token = re.search(r'name="login_token" value="([^"]+)"', page.text)
    assert token, page.text
    reply = client.post("/login", data={"login_token": token.group(1), "username": user,
                                        "password": password, "next": "/"})
    assert reply.status_code == 303 and "error" not in reply.headers["location"], reply.headers
    return client


def csrf_of(client: httpx.Client, path: str = "/") -> str:
    """The session's CSRF token, as a page carries it in its forms."""
    page = client.get(path)
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def api(client: httpx.Client, path: str, **params: Any) -> Any:
    reply = client.get(path, params=params)
    assert reply.status_code == 200, (path, reply.status_code, reply.text)
    return reply.json()


@pytest.fixture(scope="module")
def open_console(cluster: list[DisqueProcess],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    """One console over :func:`cluster`, shared by a module's read-mostly tests."""
    seeds = ",".join(f"127.0.0.1:{n.port}" for n in cluster)
    console = ConsoleProcess(tmp_path_factory.mktemp("open-console"), "--nodes", seeds,
                             "--data-dir", str(tmp_path_factory.mktemp("open-data")))
    console.start()
    yield console
    console.stop()
