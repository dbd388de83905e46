"""A node that cannot start says why, exits non-zero and leaves no identity.

Each failure is tried in the foreground and with ``daemonize yes``, where the
command must not return before the detached node listens (or failed): a
daemon that exits 0 and dies silently lets a user MEET somebody else's node
on the port it could not take.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis

from disque.config import DIRECTIVES, Config
from tests.support.process import MAX_NODE_PORT, free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "disque.server"]


def run(*args: str, cwd: Path, user: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(user or []), *SERVER, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def one_line_reason(result: subprocess.CompletedProcess[str]) -> str:
    """The reason on stderr: one line, after the program's name."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("disque-server: "), result.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> socket.socket:
    """A listening socket on a port a node could use (at most MAX_NODE_PORT)."""
    while True:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        if sock.getsockname()[1] <= MAX_NODE_PORT:
            break
        sock.close()
    sock.listen()
    yield sock
    sock.close()


@pytest.mark.parametrize("daemonize", ["no", "yes"])
def test_a_taken_client_port_is_a_loud_failure(tmp_path: Path, taken_port: socket.socket,
                                               daemonize: str) -> None:
    port = taken_port.getsockname()[1]
    result = run("--port", str(port), "--daemonize", daemonize, "--logfile", "node.log",
                 cwd=tmp_path)
    assert result.returncode == 1
    reason = one_line_reason(result)
    assert f"listening socket 127.0.0.1:{port}: Address already in use" in reason
    assert not (tmp_path / "nodes.conf").exists()  # no new identity from a failed start
    assert "Address already in use" in (tmp_path / "node.log").read_text()


@pytest.mark.parametrize("daemonize", ["no", "yes"])
def test_a_taken_bus_port_is_a_loud_failure(tmp_path: Path, daemonize: str) -> None:
    while True:  # a free client port whose bus port (+10000) we can take
        port = free_port()
        bus = socket.socket()
        try:
            bus.bind(("127.0.0.1", port + 10000))
            break
        except OSError:
            bus.close()
    bus.listen()
    try:
        result = run("--port", str(port), "--daemonize", daemonize, "--logfile", "node.log",
                     cwd=tmp_path)
    finally:
        bus.close()
    assert result.returncode == 1
    assert f"cluster bus TCP listening socket 127.0.0.1:{port + 10000}" in \
        one_line_reason(result)
    assert not (tmp_path / "nodes.conf").exists()


@pytest.mark.parametrize("daemonize", ["no", "yes"])
def test_an_unreadable_config_file_is_a_loud_failure(tmp_path: Path, daemonize: str) -> None:
    result = run(str(tmp_path / "missing.conf"), "--daemonize", daemonize, cwd=tmp_path)
    assert result.returncode == 1
    assert "can't open config file" in result.stderr and "No such file" in result.stderr
    assert not (tmp_path / "nodes.conf").exists()


@pytest.mark.parametrize("daemonize", ["no", "yes"])
def test_a_missing_directory_is_a_loud_failure(tmp_path: Path, daemonize: str) -> None:
    result = run("--port", "0", "--dir", str(tmp_path / "nowhere"), "--daemonize", daemonize,
                 "--logfile", str(tmp_path / "node.log"), cwd=tmp_path)
    assert result.returncode == 1
    assert "Can't chdir to" in one_line_reason(result)


def _unprivileged() -> list[str] | None:
    """A prefix that runs a command without the power to write anywhere.

    Root keeps its user ID but drops every capability (CAP_DAC_OVERRIDE
    included), so permission bits apply to it; another user would not do:
    the interpreter may live where only root can read (a pyenv under /root).
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all"] if setpriv else None


@pytest.mark.parametrize("daemonize", ["no", "yes"])
def test_a_directory_it_cannot_write_is_a_loud_failure(tmp_path: Path, daemonize: str) -> None:
    user = _unprivileged()
    if user is None:
        pytest.skip("running as root without setpriv (util-linux): root can write anywhere")
    # Outside pytest's tmp_path, which other users cannot enter.
    base = Path(tempfile.mkdtemp(prefix="disque-startup-"))
    try:
        base.chmod(0o755)
        data = base / "data"
        data.mkdir(mode=0o555)
        log = base / "node.log"
        log.touch(mode=0o666)
        log.chmod(0o666)
        result = run("--port", "0", "--dir", str(data), "--daemonize", daemonize,
                     "--logfile", str(log), cwd=Path("/"), user=user)
        assert list(data.iterdir()) == []
    finally:
        shutil.rmtree(base)
    assert result.returncode == 1
    assert f"Can't write to the working directory '{data}': Permission denied" in \
        one_line_reason(result)


def test_daemonize_returns_once_the_node_listens(tmp_path: Path) -> None:
    port = free_port()
    pidfile = tmp_path / "node.pid"
    result = run("--port", str(port), "--daemonize", "yes", "--pidfile", str(pidfile),
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == result.stderr == ""
    client = redis.Redis(port=port, protocol=2, socket_timeout=10)
    try:
        assert client.ping()  # at once: no polling, the command waited for it
        assert int(pidfile.read_text()) == client.info()["process_id"]
        assert (tmp_path / "nodes.conf").exists()
    finally:
        client.shutdown(nosave=True)
        client.close()


def test_print_config_shows_every_directive_commented(tmp_path: Path) -> None:
    result = run("--print-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    lines = text.splitlines()
    for name in DIRECTIVES:
        (at,) = [i for i, line in enumerate(lines) if line.split(" ", 1)[0] == name]
        assert lines[at - 1].startswith("# "), name  # the comment right above it
        assert Config().formatted(name) in lines[at], name
    loaded = Config()
    loaded.load_text(text, "printed")  # a disque.conf as it is
    assert all(loaded.get(n) == Config().get(n) for n in DIRECTIVES)
    # The sample that ships is exactly this.
    assert (ROOT / "disque.conf").read_text() == text


def test_print_config_shows_what_a_file_and_arguments_make(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("appendonly yes\nport 7000\n")
    result = run("--print-config", str(conf), "--port", "7100", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\nappendonly yes\n" in result.stdout and "\nport 7100\n" in result.stdout
