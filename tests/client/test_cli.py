"""The ``disque`` command-line tool, run as a subprocess against real servers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pexpect
import pytest
import redis

from disque import Client
from disque.cli.session import _start_deaf_to_ctrl_c
from disque.exceptions import NoAuth
from tests.client.conftest import address, fake_job_id
from tests.support.process import DisqueProcess, free_port, wait_for

CLI = [sys.executable, "-m", "disque.cli"]
JOB_ID = re.compile(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")


def disque(port: int, *args: str, env: dict[str, str] | None = None,
           timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-p", str(port), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})



def test_one_shot_formatted_output(server: DisqueProcess) -> None:
    p = server.port
    assert disque(p, "--no-raw", "ping").stdout == "PONG\n"
    added = disque(p, "--no-raw", "addjob", "q", 'say "hi"\n', "0")
    assert added.returncode == 0 and JOB_ID.fullmatch(added.stdout.strip())
    job_id = added.stdout.strip()
    assert disque(p, "--no-raw", "qlen", "q").stdout == "(integer) 1\n"
    got = disque(p, "--no-raw", "getjob", "from", "q").stdout
    assert got == f'1) 1) "q"\n   2) "{job_id}"\n   3) "say \\"hi\\"\\n"\n'
    assert disque(p, "--no-raw", "getjob", "nohang", "from", "q").stdout == "(nil)\n"
    assert disque(p, "--no-raw", "qpeek", "q", "5").stdout == "(empty array)\n"
    stat = disque(p, "--no-raw", "qstat", "q").stdout
    assert stat.startswith(' 1) "name"\n 2) "q"\n 3) "len"\n 4) (integer) 0\n')
    assert '12) (empty array)\n' in stat
    assert disque(p, "--no-raw", "cluster", "leaving").stdout == "no\n"
    info = disque(p, "--no-raw", "info", "server").stdout  # INFO is always raw text
    assert info.startswith("# Server") and f"tcp_port:{p}" in info


def test_one_shot_raw_output_when_piped(server: DisqueProcess) -> None:
    p = server.port
    assert disque(p, "ping").stdout == "PONG\n"
    job_id = disque(p, "--raw", "addjob", "q", "body", "0").stdout.strip()
    assert JOB_ID.fullmatch(job_id)
    assert disque(p, "getjob", "from", "q").stdout == f"q\n{job_id}\nbody\n"
    assert disque(p, "qlen", "q").stdout == "0\n"
    assert disque(p, "getjob", "nohang", "from", "q").stdout == "\n"


def test_qscan_shows_a_small_keyspace_in_one_call(server: DisqueProcess) -> None:
    p = server.port
    for queue in ("emails", "sms", "push"):
        disque(p, "addjob", queue, "x", "0")
    out = disque(p, "--no-raw", "qscan").stdout.splitlines()
    assert out[0] == '1) "0"'  # the cursor: the iteration is complete
    assert sorted(line.split('"')[1] for line in out[1:]) == ["emails", "push", "sms"]


def test_error_replies_exit_non_zero(server: DisqueProcess) -> None:
    p = server.port
    result = disque(p, "--no-raw", "working", fake_job_id())
    assert result.returncode == 1
    assert result.stdout == "(error) NOJOB Job not known in the context of this node.\n"
    raw = disque(p, "ackjob", "bad")
    assert (raw.returncode, raw.stdout) == (1, "BADID Invalid Job ID format.\n")
    unknown = disque(p, "--no-raw", "nosuchcommand")
    assert unknown.stdout == "(error) ERR unknown command 'nosuchcommand'\n"


def test_cluster_meet_is_passed_through(server: DisqueProcess) -> None:
    port = free_port()
    result = disque(server.port, "--no-raw", "cluster", "meet", "127.0.0.1", str(port))
    assert (result.returncode, result.stdout) == (0, "OK\n")
    # Nobody listens there: the handshake node shows until it times out.
    nodes = disque(server.port, "cluster", "nodes")
    assert f" 127.0.0.1:{port} handshake " in nodes.stdout, nodes.stdout
    bad = disque(server.port, "--no-raw", "cluster", "meet", "not-an-ip", "7712")
    assert bad.stdout == "(error) ERR Invalid node address specified: not-an-ip:7712\n"


def test_connection_failure() -> None:
    port = free_port()
    result = disque(port, "ping")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"Could not connect to Disque at 127.0.0.1:{port}: ")


def test_password(server_factory) -> None:
    secured = server_factory("--requirepass", "pw")
    denied = disque(secured.port, "--no-raw", "qlen", "q")
    assert (denied.returncode, denied.stdout) == (1, "(error) NOAUTH Authentication required.\n")
    assert disque(secured.port, "-a", "pw", "ping").stdout == "PONG\n"
    assert disque(secured.port, "ping", env={"DISQUE_PASSWORD": "pw"}).stdout == "PONG\n"
    wrong = disque(secured.port, "-a", "nope", "ping")
    assert wrong.returncode == 1 and "invalid password" in wrong.stdout


def test_user(server_factory) -> None:
    """--user (ACL, an extension): AUTH user password, like redis-cli's --user."""
    node = server_factory("--requirepass", "pw")
    assert disque(node.port, "-a", "pw", "ACL", "SETUSER", "alice", "on", ">apw", "~jobs:*",
                  "+@all").stdout == "OK\n"
    assert disque(node.port, "--user", "alice", "-a", "apw", "ACL", "WHOAMI").stdout == "alice\n"
    refused = disque(node.port, "--user", "alice", "-a", "apw", "--no-raw", "QLEN", "other")
    assert refused.stdout == ("(error) NOPERM User alice has no permissions to access the "
                              "'other' queue\n")
    wrong = disque(node.port, "--user", "alice", "-a", "nope", "ping")
    assert wrong.returncode == 1 and "WRONGPASS" in wrong.stdout
    lacking = disque(node.port, "--user", "alice", "ping")
    assert lacking.returncode == 2 and "--user needs a password" in lacking.stderr


def test_ping_without_password_answers_like_redis_cli(server_factory) -> None:
    # The node answers PING before AUTH (health checks); the CLI must show
    # that answer, as redis-cli does, not fail its own handshake first.
    secured = server_factory("--requirepass", "pw")
    plain = redis.Redis(port=secured.port, protocol=2)
    assert plain.ping() is True
    plain.close()
    pinged = disque(secured.port, "--no-raw", "ping")
    assert (pinged.returncode, pinged.stdout, pinged.stderr) == (0, "PONG\n", "")
    # A program using the library still learns at connect that it lacks the password.
    with pytest.raises(NoAuth), Client(address(secured), reconnect_timeout=0) as c:
        c.ping()


def test_host_option_and_help(server: DisqueProcess) -> None:
    result = subprocess.run([*CLI, "-h", "127.0.0.1", "-p", str(server.port), "ping"],
                            capture_output=True, text=True, timeout=20)
    assert result.stdout == "PONG\n"
    helped = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=20)
    assert helped.returncode == 0 and "-a PASSWORD" in helped.stdout
    version = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=20)
    assert version.stdout.startswith("disque ")


def test_monitor_queues(server: DisqueProcess) -> None:
    with Client(address(server)) as c:
        c.add_jobs("emails", [b"x"] * 3)
        c.add_job("sms", b"y")
        c.add_job("sms", b"urgent", priority=10)
        c.pause("sms", "in")
        c.qlimit("emails", 20, 500)
    result = disque(server.port, "monitor-queues", "--interval", "0.05", "--count", "2")
    assert result.returncode == 0, result.stderr
    tables = result.stdout.split("\n\n")
    assert len(tables) == 2
    for table in tables:
        lines = table.strip().splitlines()
        assert lines[0].startswith(f"127.0.0.1:{server.port}") and "queues: 2" in lines[0]
        assert lines[1].split() == ["QUEUE", "LEN", "AGE", "IDLE", "BLOCKED", "IMPORT-RATE",
                                    "IN/S", "OUT/S", "JOBS-IN", "JOBS-OUT", "DEAD-LETTERED",
                                    "PAUSE", "PRIORITIES", "RATE-LIMIT", "GROUPS"]
        emails, sms = (line.split() for line in lines[2:])
        assert (emails[0], emails[1], *emails[-4:]) == ("emails", "3", "none", "-",
                                                         "20/500ms:20", "-")
        assert (sms[0], sms[1], *sms[-4:]) == ("sms", "2", "in", "10:1", "-", "-")
    assert "0.0" in tables[1]  # rates appear from the second refresh on
    filtered = disque(server.port, "monitor-queues", "--count", "1", "--minlen", "3")
    assert "emails" in filtered.stdout and "sms" not in filtered.stdout
    assert disque(server.port, "monitor-queues", "--bogus").returncode == 2


def test_installed_script() -> None:
    script = shutil.which("disque")
    if script is None:
        pytest.skip("the disque script is not installed (pip install -e .)")
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0 and result.stdout.startswith("disque ")


# ------------------------------------------------------------------ interactive

def spawn(port: int, history: Path, sigint: signal.Handlers = signal.SIG_DFL) -> pexpect.spawn:
    """The CLI on a terminal, started with ``sigint`` as its SIGINT disposition
    (SIG_DFL, whatever this test process inherited)."""
    env = {**os.environ, "DISQUE_HISTFILE": str(history), "TERM": "dumb"}
    return pexpect.spawn(sys.executable, [*CLI[1:], "-p", str(port)], env=env,
                         encoding="utf-8", timeout=15, dimensions=(40, 200),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def test_interactive_session_with_history(server: DisqueProcess, tmp_path: Path) -> None:
    history = tmp_path / "history"
    prompt = f"127.0.0.1:{server.port}> "
    child = spawn(server.port, history)
    child.expect_exact(prompt)
    child.sendline("ping")
    child.expect_exact("PONG")
    child.expect_exact(prompt)
    child.sendline('addjob q "hello world" 0')
    child.expect(JOB_ID.pattern)
    child.sendline("qlen q")
    child.expect_exact("(integer) 1")
    child.sendline("getjob from q")
    child.expect_exact('3) "hello world"')
    child.sendline("nosuch")
    child.expect_exact("(error) ERR unknown command 'nosuch'")
    child.sendline('echo "unbalanced')
    child.expect_exact("Invalid argument(s)")
    child.sendline("help")
    child.expect_exact("monitor-queues")
    child.sendline("monitor-queues --count 1")
    child.expect_exact("QUEUE")
    child.expect_exact(prompt)
    child.sendline("cluster meet not-an-ip 7712")
    child.expect_exact("(error) ERR Invalid node address")
    child.expect_exact(prompt)
    child.sendline("quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    saved = history.read_text().splitlines()
    assert saved[:2] == ["ping", 'addjob q "hello world" 0']
    assert saved[-1] == "quit"

    # A new session loads the history: Ctrl-P recalls the last line ("quit").
    child = spawn(server.port, history)
    child.expect_exact(prompt)
    child.send("\x10\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_interactive_not_connected_then_reconnects(server_factory, tmp_path: Path) -> None:
    node = server_factory()
    port = node.port
    node.stop()
    child = spawn(port, tmp_path / "history")
    child.expect_exact(f"Could not connect to Disque at 127.0.0.1:{port}")
    child.expect_exact("not connected> ")
    child.sendline("ping")
    child.expect_exact("Could not connect")
    child.expect_exact("not connected> ")
    node.start(port=port)
    child.sendline("ping")
    child.expect_exact("PONG")
    child.expect_exact(f"127.0.0.1:{port}> ")
    node.restart()  # the connection drops under the session: re-sent once
    child.sendline("ping")
    child.expect_exact("PONG")
    # Ctrl-D only once readline reads again (it draws the prompt after it
    # took the terminal): sent while the CLI still printed PONG, on a loaded
    # machine, the EOF reached a terminal in line mode and was lost.
    child.expect_exact(f"127.0.0.1:{port}> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _ctrl_c_stops_a_blocked_getjob(child: pexpect.spawn, prompt: str, observer: Client) -> None:
    """GETJOB blocks the CLI (``observer`` sees it blocked on the node);
    Ctrl-C brings the prompt back, and the session still works."""
    child.sendline("getjob from nothing-here")
    with observer as c:
        wait_for(lambda: c.info("clients")["clients"]["blocked_clients"] == 1,
                 message="CLI blocked in GETJOB")
    child.sendintr()
    child.expect_exact(prompt)
    child.sendline("ping")
    child.expect_exact("PONG")


def test_interactive_auth_and_ctrl_c(server_factory, tmp_path: Path) -> None:
    secured = server_factory("--requirepass", "pw")
    prompt = f"127.0.0.1:{secured.port}> "
    child = spawn(secured.port, tmp_path / "history")
    child.expect_exact(prompt)  # connected: the node answers what it answers without AUTH
    child.sendline("ping")
    child.expect_exact("PONG")
    child.sendline("qlen q")
    child.expect_exact("(error) NOAUTH Authentication required.")
    child.expect_exact(prompt)
    child.sendline("auth wrong")
    child.expect_exact("(error) ERR invalid password")
    child.sendline("auth pw")
    child.expect_exact("OK")
    child.expect_exact(prompt)
    _ctrl_c_stops_a_blocked_getjob(child, prompt, Client(address(secured), password="pw"))
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_shutdown_is_success_and_never_resent(server: DisqueProcess) -> None:
    result = disque(server.port, "shutdown")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    wait_for(lambda: not server.alive(), message="the node to exit")
    again = disque(server.port, "shutdown")  # nothing listens: a real error
    assert again.returncode == 1 and "Could not connect" in again.stderr


def test_blocking_getjob_says_what_it_waits_for(server: DisqueProcess) -> None:
    # On a terminal a GETJOB that waits says so (the tour's GETJOB on an
    # empty queue would otherwise hang with no clue), then prints the job.
    child = pexpect.spawn(sys.executable, [*CLI[1:], "-p", str(server.port), "getjob", "from",
                                           "empty-q"], env={**os.environ, "TERM": "dumb"},
                          encoding="utf-8", timeout=15, dimensions=(40, 200))
    child.expect_exact("(waiting for a job from empty-q until one arrives; Ctrl-C stops. "
                       "NOHANG answers at once, TIMEOUT <ms> bounds the wait)")
    with Client(address(server)) as c:
        job_id = c.add_job("empty-q", b"late")
    child.expect_exact(f'2) "{job_id}"')
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_waiting_hint_only_on_a_terminal_and_only_when_it_waits(server: DisqueProcess) -> None:
    waited = disque(server.port, "getjob", "timeout", "1500", "from", "empty-q")
    assert (waited.returncode, waited.stdout, waited.stderr) == (0, "\n", "")  # piped: quiet
    child = pexpect.spawn(sys.executable, [*CLI[1:], "-p", str(server.port), "getjob",
                                           "timeout", "1500", "from", "empty-q"],
                          env={**os.environ, "TERM": "dumb"}, encoding="utf-8", timeout=15)
    child.expect_exact("(waiting for a job from empty-q for up to 1500 ms; Ctrl-C stops)")
    child.expect_exact("(nil)")
    child.expect(pexpect.EOF)
    quick = pexpect.spawn(sys.executable, [*CLI[1:], "-p", str(server.port), "getjob", "nohang",
                                           "from", "empty-q"],
                          env={**os.environ, "TERM": "dumb"}, encoding="utf-8", timeout=15)
    quick.expect(pexpect.EOF)
    assert quick.before.strip() == "(nil)"


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no POSIX signal masks")
def test_the_wait_hint_thread_leaves_ctrl_c_to_the_main_thread() -> None:
    # A SIGINT taken by the hint thread would leave the main thread blocked
    # in GETJOB's read: the thread must start with SIGINT blocked, and the
    # main thread's mask must be as it was.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    seen: list[set[signal.Signals]] = []
    thread = threading.Thread(target=lambda: seen.append(
        signal.pthread_sigmask(signal.SIG_BLOCK, set())))
    _start_deaf_to_ctrl_c(thread)
    thread.join(10)
    assert seen and signal.SIGINT in seen[0]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before


def test_ctrl_c_stops_a_blocked_getjob_even_when_started_with_sigint_ignored(
        server: DisqueProcess, tmp_path: Path) -> None:
    # A background job of a script (and some CI runners) starts with SIGINT
    # ignored; at a terminal the prompt takes it back.
    prompt = f"127.0.0.1:{server.port}> "
    child = spawn(server.port, tmp_path / "history", sigint=signal.SIG_IGN)
    child.expect_exact(prompt)
    _ctrl_c_stops_a_blocked_getjob(child, prompt, Client(address(server)))
    child.sendline("quit")
    child.expect(pexpect.EOF)
