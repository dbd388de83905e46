"""Users with permissions (ACL, an extension in Redis's shape) on a real node:
the default user as before, users with passwords, command categories and
queue patterns, -NOPERM and -WRONGPASS, what is counted, the ACL file, and
every bad rule refused with the user left as it was (docs/EXTENSIONS.md,
"Users and permissions")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.server.test_bad_input import arg_id, assert_error, info_int
from tests.server.test_protocol_raw import JOB_ID, Resp
from tests.support.metrics import scrape, value
from tests.support.process import DisqueProcess, free_port

ALICE = ("alice", "on", ">wonderland", "~orders:*", "+@read", "+@write")


def pairs(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(*[iter(reply)] * 2, strict=True))


@pytest.fixture
def admin(node: DisqueProcess) -> Iterator[Resp]:
    """The default user (no password), users reset around each test."""
    with Resp(node.port) as conn:
        conn.call("DEBUG", "FLUSHALL")
        for name in conn.call("ACL", "USERS"):
            if name != b"default":
                conn.call("ACL", "DELUSER", name)
        yield conn
        for name in conn.call("ACL", "USERS"):
            if name != b"default":
                conn.call("ACL", "DELUSER", name)
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"


def refused_storing_nothing(admin: Resp, c: Resp, args: tuple, error: str) -> None:
    """``args`` sent on ``c`` get ``error``; ``admin`` sees no new job."""
    jobs = info_int(admin, "jobs", "registered_jobs")
    assert_error(c, args, exact=error)
    assert info_int(admin, "jobs", "registered_jobs") == jobs, "a refused command stored a job"


def login(node: DisqueProcess, user: str, password: str) -> Resp:
    conn = Resp(node.port)
    assert conn.call("AUTH", user, password) == b"OK"
    return conn


def test_the_default_user_is_the_original_node(admin: Resp) -> None:
    assert admin.call("ACL", "WHOAMI") == b"default"
    assert admin.call("ACL", "LIST") == [b"user default on nopass ~* +@all"]
    assert JOB_ID.match(admin.call("ADDJOB", "q", "x", 0))
    assert_error(admin, ("AUTH", "x"), exact="ERR Client sent AUTH, but no password is set")
    assert "user=default" in admin.call("CLIENT", "INFO").decode()


def test_a_user_limited_to_commands_and_queues(admin: Resp, node: DisqueProcess) -> None:
    assert admin.call("ACL", "SETUSER", *ALICE) == b"OK"
    other = admin.call("ADDJOB", "payroll", "salary", 0)
    assert JOB_ID.match(other), other
    with login(node, "alice", "wonderland") as alice:
        assert alice.call("ACL", "WHOAMI") == b"alice"
        mine = alice.call("ADDJOB", "orders:1", "order", 0)
        assert JOB_ID.match(mine)
        refused_storing_nothing(admin, alice, ("ADDJOB", "payroll", "x", 0),
                                "NOPERM User alice has no permissions to access the 'payroll' "
                                "queue")
        refused_storing_nothing(admin, alice, ("ADDJOBS", "payroll", 0, "BODIES", "a"),
                                "NOPERM User alice has no permissions to access the 'payroll' "
                                "queue")
        assert_error(alice, ("GETJOB", "NOHANG", "FROM", "orders:1", "payroll"),
                     exact="NOPERM User alice has no permissions to access the 'payroll' queue")
        assert_error(alice, ("SHOW", other), exact=(
            f"NOPERM User alice has no permissions to access the queue of job {other.decode()}"))
        assert_error(alice, ("ACKJOB", mine, other), exact=(
            f"NOPERM User alice has no permissions to access the queue of job {other.decode()}"))
        assert_error(alice, ("CONFIG", "GET", "*"),
                     exact="NOPERM User alice has no permissions to run the 'config' command")
        assert_error(alice, ("INFO",),
                     exact="NOPERM User alice has no permissions to run the 'info' command")
        assert_error(alice, ("ADDJOB", "orders:2", "x", 0, "RETRY", 5, "MAXDELIVERIES", 2,
                             "DEADLETTER", "payroll"),
                     exact="NOPERM User alice has no permissions to access the 'payroll' queue")
        # The scans show only its queues and jobs.
        assert alice.call("QSCAN", "COUNT", 1000, "BUSYLOOP")[1] == [b"orders:1"]
        assert alice.call("JSCAN", "COUNT", 1000, "BUSYLOOP")[1] == [mine]
        # An ID this node does not hold: no dummy ACK that could reach any
        # queue on another node, no FASTACK broadcast.
        unknown = b"D-00000000-" + b"A" * 24 + b"-05a1"
        assert alice.call("ACKJOB", unknown) == 0
        assert admin.call("SHOW", unknown) is None
        got = alice.call("GETJOB", "FROM", "orders:1")
        assert got[0][1] == mine and alice.call("ACKJOB", mine) == 1
        assert alice.call("PING") == b"PONG" and alice.call("HELLO")[0] == 1
        assert alice.call("CLIENT", "SETNAME", "worker-1") == b"OK"
        assert_error(alice, ("CLIENT", "LIST"),
                     exact="NOPERM User alice has no permissions to run the 'client' command")
    assert admin.call("SHOW", other) is not None  # untouched
    assert info_int(admin, "extensions", "acl_access_denied_key") >= 6
    assert info_int(admin, "extensions", "acl_access_denied_cmd") >= 3


def test_a_reader_cannot_add_and_nothing_is_stored(admin: Resp, node: DisqueProcess) -> None:
    assert admin.call("ACL", "SETUSER", "reader", "on", ">r", "~*", "+@read") == b"OK"
    job = admin.call("ADDJOB", "q", "x", 0)
    with login(node, "reader", "r") as reader:
        refused_storing_nothing(admin, reader, ("ADDJOB", "q", "y", 0),
                                "NOPERM User reader has no permissions to run the 'addjob' "
                                "command")
        assert_error(reader, ("GETJOB", "NOHANG", "FROM", "q"),
                     exact="NOPERM User reader has no permissions to run the 'getjob' command")
        assert reader.call("QLEN", "q") == 1
        assert pairs(reader.call("SHOW", job))[b"body"] == b"x"
    assert admin.call("QLEN", "q") == 1


def test_auth_failures_and_the_users_state(admin: Resp, node: DisqueProcess) -> None:
    admin.call("ACL", "SETUSER", *ALICE)
    before = info_int(admin, "extensions", "acl_access_denied_auth")
    wrong = "WRONGPASS invalid username-password pair or user is disabled."
    with Resp(node.port) as c:
        assert_error(c, ("AUTH", "alice", "nope"), exact=wrong)
        assert_error(c, ("AUTH", "nobody", "x"), exact=wrong)
        assert c.call("ACL", "WHOAMI") == b"default"  # default needs no password here
        admin.call("ACL", "SETUSER", "alice", "off")
        assert_error(c, ("AUTH", "alice", "wonderland"), exact=wrong)
        admin.call("ACL", "SETUSER", "alice", "on", "nopass")
        assert c.call("AUTH", "alice", "anything") == b"OK"  # nopass: any password
    assert info_int(admin, "extensions", "acl_access_denied_auth") == before + 3


def test_turning_a_user_off_or_deleting_it_closes_its_connections(admin: Resp,
                                                                  node: DisqueProcess) -> None:
    admin.call("ACL", "SETUSER", *ALICE)
    with login(node, "alice", "wonderland") as alice:
        assert "user=alice" in admin.call("CLIENT", "LIST").decode()
        admin.call("ACL", "SETUSER", "alice", "off")
        assert alice.read_until_closed() == b""
    admin.call("ACL", "SETUSER", "alice", "on")
    with login(node, "alice", "wonderland") as alice:
        assert admin.call("ACL", "DELUSER", "alice", "ghost") == 1
        assert alice.read_until_closed() == b""
    admin.call("ACL", "SETUSER", *ALICE)
    with login(node, "alice", "wonderland") as alice:
        assert admin.call("CLIENT", "KILL", "USER", "alice") == 1
        assert alice.read_until_closed() == b""
    assert_error(admin, ("ACL", "DELUSER", "default"),
                 exact="ERR The 'default' user cannot be removed")


def test_changes_reach_connected_clients_at_once(admin: Resp, node: DisqueProcess) -> None:
    admin.call("ACL", "SETUSER", *ALICE)
    with login(node, "alice", "wonderland") as alice:
        assert alice.call("QLEN", "orders:x") == 0
        admin.call("ACL", "SETUSER", "alice", "-qlen")
        assert_error(alice, ("QLEN", "orders:x"),
                     exact="NOPERM User alice has no permissions to run the 'qlen' command")
        admin.call("ACL", "SETUSER", "alice", "allkeys", "+@all")
        assert alice.call("CONFIG", "GET", "hz") == [b"hz", b"10"]
        assert alice.call("QLEN", "payroll") == 0


def test_getuser_list_and_cat(admin: Resp) -> None:
    admin.call("ACL", "SETUSER", *ALICE, "-pause")
    described = admin.call("ACL", "LIST")
    assert described[0] == b"user default on nopass ~* +@all"
    line = described[1].decode()
    digest = "#" + __import__("hashlib").sha256(b"wonderland").hexdigest()
    assert line == f"user alice on {digest} ~orders:* +@read +@write -pause"
    user = pairs(admin.call("ACL", "GETUSER", "alice"))
    assert user[b"flags"] == [b"on"] and user[b"passwords"] == [digest[1:].encode()]
    assert user[b"commands"] == b"+@read +@write -pause" and user[b"keys"] == b"~orders:*"
    assert admin.call("ACL", "GETUSER", "nobody") is None
    categories = admin.call("ACL", "CAT")
    assert {b"read", b"write", b"admin", b"dangerous", b"connection"} <= set(categories)
    assert b"addjob" in admin.call("ACL", "CAT", "write")
    assert b"config" in admin.call("ACL", "CAT", "@admin")
    assert_error(admin, ("ACL", "CAT", "nope"), exact="ERR Unknown category 'nope'")


SETUSER_ERRORS = [
    (("bob", "on", "bogus"), "ERR Error in ACL SETUSER modifier 'bogus': Syntax error"),
    (("bob", "+nosuchcommand"),
     "ERR Error in ACL SETUSER modifier '+nosuchcommand': Unknown command or category name "
     "in ACL"),
    (("bob", "+@nosuch"),
     "ERR Error in ACL SETUSER modifier '+@nosuch': Unknown command or category name in ACL"),
    (("bob", "#abc"), "ERR Error in ACL SETUSER modifier '#abc': The password hash must be "
                      "exactly 64 characters and contain only lowercase hexadecimal characters"),
    (("bob", "<never-set"), "ERR Error in ACL SETUSER modifier '<never-set': no such password"),
    (("bob", "~"), "ERR Error in ACL SETUSER modifier '~': Syntax error"),
    (("b b", "on"), "ERR Usernames can't contain spaces or null characters"),
    ((b"b\x00", "on"), "ERR Usernames can't contain spaces or null characters"),
]


@pytest.mark.parametrize(("args", "error"), SETUSER_ERRORS, ids=arg_id)
def test_a_bad_rule_changes_nothing(admin: Resp, args: tuple, error: str) -> None:
    admin.call("ACL", "SETUSER", "bob", "on", ">pw", "~q*", "+@read")
    before = admin.call("ACL", "LIST")
    assert_error(admin, ("ACL", "SETUSER", *args), exact=error)
    assert admin.call("ACL", "LIST") == before


@pytest.mark.parametrize(("args", "error"), [
    (("ACL",), "ERR wrong number of arguments for 'acl' command"),
    (("ACL", "SETUSER"), "ERR wrong number of arguments for 'acl|setuser' command"),
    (("ACL", "FROB"), "ERR unknown subcommand 'FROB'. Try ACL SETUSER, GETUSER, DELUSER, "
                      "LIST, USERS, WHOAMI, CAT, SAVE, LOAD."),
    (("ACL", "SAVE"), "ERR This node is not configured to use an ACL file: set the aclfile "
                      "directive (at start) to save and load users"),
    (("AUTH", "a", "b", "c"), "ERR syntax error"),
], ids=arg_id)
def test_bad_acl_commands(admin: Resp, args: tuple, error: str) -> None:
    assert_error(admin, args, exact=error)


def test_patterns_follow_redis_glob(admin: Resp, node: DisqueProcess) -> None:
    admin.call("ACL", "SETUSER", "g", "on", "nopass", "+@all", "~a?c", "~x[0-9]", "~lit\\*",
               "~n[^z]")
    with login(node, "g", "-") as g:
        for queue, allowed in (("abc", True), ("abbc", False), ("x7", True), ("xa", False),
                               ("lit*", True), ("litx", False), ("ny", True), ("nz", False)):
            reply = g.call("QLEN", queue)
            assert (reply == 0) == allowed, (queue, reply)


def test_requirepass_is_the_default_users_password(server_factory) -> None:
    node = server_factory("--requirepass", "s3cret")
    with Resp(node.port) as c:
        assert_error(c, ("QLEN", "q"), exact="NOAUTH Authentication required.")
        assert c.call("AUTH", "default", "s3cret") == b"OK"
        assert c.call("ACL", "LIST")[0].startswith(b"user default on #")
        assert c.call("ACL", "SETUSER", "alice", "on", ">pw", "~*", "+@all") == b"OK"
        assert c.call("CONFIG", "SET", "requirepass", "") == b"OK"
        assert c.call("ACL", "LIST")[0] == b"user default on nopass ~* +@all"
    # redis-py, both protocols, with a username.
    for protocol in (2, 3):
        r = redis.Redis(port=node.port, username="alice", password="pw", protocol=protocol)
        try:
            assert r.execute_command("ACL", "WHOAMI") in (b"alice", "alice")
        finally:
            r.close()
    bad = redis.Redis(port=node.port, username="alice", password="nope", protocol=3)
    with pytest.raises(redis.exceptions.AuthenticationError):
        bad.ping()
    bad.close()


def test_the_acl_file(server_factory, tmp_path: Path) -> None:
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("# our users\n\nuser worker on >pw ~jobs:* +@read +@write\n")
    node = server_factory("--aclfile", str(aclfile))
    with Resp(node.port) as c:
        assert c.call("ACL", "USERS") == [b"default", b"worker"]
        assert c.call("ACL", "SETUSER", "ops", "on", ">ops-pw", "~*", "+@all") == b"OK"
        assert c.call("AUTH", "ops", "ops-pw") == b"OK"
        assert c.call("ACL", "SETUSER", "default", "off") == b"OK"  # only named users now
        assert c.call("ACL", "SAVE") == b"OK"
    saved = aclfile.read_text()
    assert "ops-pw" not in saved and "user ops on #" in saved and "user default off" in saved
    assert oct(aclfile.stat().st_mode & 0o777) == "0o600"
    node.kill()
    node.start(port=node.port)
    with Resp(node.port) as c:
        assert_error(c, ("PING", "x"), exact="NOAUTH Authentication required.")
        assert c.call("AUTH", "ops", "ops-pw") == b"OK"
        assert c.call("ACL", "USERS") == [b"default", b"worker", b"ops"]
        # ACL LOAD: all or nothing.
        aclfile.write_text(saved + "user broken on +@nosuch\n")
        assert_error(c, ("ACL", "LOAD"), prefix="ERR Error loading the ACL file: line 4: ")
        assert c.call("ACL", "USERS") == [b"default", b"worker", b"ops"]
        aclfile.write_text("user ops on >ops-pw ~* +@all\n")
        assert c.call("ACL", "LOAD") == b"OK"
        assert c.call("ACL", "USERS") == [b"default", b"ops"]


@pytest.mark.parametrize(("text", "error"), [
    ("user x on +@nosuch\n", "line 1: Error in user declaration '+@nosuch': Unknown command "
                             "or category name in ACL"),
    ("usr x on\n", "line 1: a line must be: user <name> <rule> ..."),
    ("user x on\nuser x off\n", "line 2: user 'x' is defined twice"),
    (None, "No such file or directory"),
])
def test_a_bad_acl_file_stops_the_node(tmp_path: Path, text: str | None, error: str) -> None:
    import subprocess
    import sys

    aclfile = tmp_path / "users.acl"
    if text is not None:
        aclfile.write_text(text)
    done = subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                           str(tmp_path), "--aclfile", str(aclfile)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"Error loading the ACL file '{aclfile}': {error}" in done.stdout + done.stderr


def test_denials_in_the_metrics(server_factory) -> None:
    port = free_port()
    node = server_factory("--metrics-port", str(port))
    with Resp(node.port) as c:
        c.call("ACL", "SETUSER", *ALICE)
        with login(node, "alice", "wonderland") as alice:
            alice.call("QLEN", "payroll")
            alice.call("CONFIG", "GET", "x")
        c.call("AUTH", "alice", "wrong")
    samples = scrape(port)
    assert value(samples, "disque_acl_denials_total", user="alice", reason="queue") == 1
    assert value(samples, "disque_acl_denials_total", user="alice", reason="command") == 1
    assert value(samples, "disque_acl_denials_total", user="alice", reason="auth") == 1
    assert value(samples, "disque_acl_users") == 2
