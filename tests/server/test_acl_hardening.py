"""The users' permissions against someone who means harm (issue: ACL file
injection, super-linear patterns, the implicit dead-letter queue, the verdict
cache): each case as an attacker probed it, refused or harmless, and the
honest use beside it still working (docs/SECURITY.md)."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest

from disque.acl import Glob, User
from disque.commands.registry import acl_catalog
from tests.server.test_bad_input import assert_error
from tests.server.test_protocol_raw import JOB_ID, Resp
from tests.support.process import DisqueProcess

# --------------------------------------------------------------------------
# The ACL file cannot be injected
# --------------------------------------------------------------------------

INJECTIONS = [
    # A newline in a pattern wrote a second user line on ACL SAVE.
    ("~tenant-eve:*\nuser mallory on nopass ~* +@all", "~"),
    # A space: the saved line read back as "~tenant-sam" and "allkeys".
    ("~tenant-sam allkeys", "~"),
    ("~a\tb", "~"), ("~a\rb", "~"), ("~a\x00b", "~"), ("~a\x7fb", "~"), ("~a\x85b", "~"),
    ("~a\u2028b", "~"), ("~a\u00a0b", "~"),
    (">pass word", ">"), (">pw\nuser mallory on nopass ~* +@all", ">"), ("<a\x00", "<"),
]


@pytest.fixture
def acl_node(server_factory, tmp_path: Path) -> tuple[DisqueProcess, Path]:
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("")
    return server_factory("--aclfile", str(aclfile)), aclfile


@pytest.mark.parametrize(("rule", "kind"), INJECTIONS, ids=lambda v: repr(v)[:40])
def test_rules_with_spaces_or_control_characters_are_refused(
        acl_node: tuple[DisqueProcess, Path], rule: str, kind: str) -> None:
    node, aclfile = acl_node
    with Resp(node.port) as c:
        assert c.call("ACL", "SETUSER", "eve", "on", ">pw", "~tenant-eve:*") == b"OK"
        before = c.call("ACL", "LIST")
        shown = rule.replace("\r", " ").replace("\n", " ")
        assert_error(c, ("ACL", "SETUSER", "eve", rule.encode("utf-8", "surrogateescape")),
                     exact=f"ERR Error in ACL SETUSER modifier '{shown}': Syntax error: a rule "
                           "can't contain spaces or control characters")
        assert c.call("ACL", "LIST") == before  # eve as she was
        assert c.call("ACL", "SAVE") == b"OK"
        assert c.call("ACL", "LOAD") == b"OK"
        assert c.call("ACL", "USERS") == [b"default", b"eve"]
        assert c.call("ACL", "LIST") == before
    assert "mallory" not in aclfile.read_text()
    node.kill()
    node.start(port=node.port)  # a saved file always loads
    with Resp(node.port) as c:
        assert c.call("ACL", "USERS") == [b"default", b"eve"]
        assert_error(c, ("AUTH", "mallory", "x"),
                     exact="WRONGPASS invalid username-password pair or user is disabled.")


def test_patterns_and_passwords_the_file_can_hold_still_work(
        acl_node: tuple[DisqueProcess, Path]) -> None:
    node, _ = acl_node
    with Resp(node.port) as c:
        assert c.call("ACL", "SETUSER", "ana", "on", ">p@ss:wörd#1", "~commandes-é:*",
                      "~[a-c]?-jobs", "+@read", "+@write") == b"OK"
        assert c.call("ACL", "SAVE") == b"OK"
        assert c.call("ACL", "LOAD") == b"OK"
    node.kill()
    node.start(port=node.port)
    with Resp(node.port) as c:
        assert c.call("AUTH", "ana", "p@ss:wörd#1".encode()) == b"OK"
        assert JOB_ID.match(c.call("ADDJOB", "commandes-é:1".encode(), "x", 0))
        assert JOB_ID.match(c.call("ADDJOB", "b9-jobs", "x", 0))
        assert_error(c, ("ADDJOB", "d9-jobs", "x", 0), prefix="NOPERM ")


def test_a_file_that_does_not_parse_changes_nothing(acl_node: tuple[DisqueProcess, Path]) -> None:
    node, aclfile = acl_node
    with Resp(node.port) as c:
        assert c.call("ACL", "SETUSER", "ops", "on", ">ops-pw", "~*", "+@all") == b"OK"
        assert c.call("ACL", "SAVE") == b"OK"
        good = aclfile.read_text()
        before = c.call("ACL", "LIST")
        # A file edited by hand with a line that is not a user's rules.
        aclfile.write_text(good + "user eve on >pw ~a\nuser eve2 on \x01 ~b\n")
        assert_error(c, ("ACL", "LOAD"), prefix="ERR Error loading the ACL file: line 4: ")
        assert c.call("ACL", "LIST") == before
        # ACL SAVE replaced the file whole (a temporary file renamed over it).
        assert c.call("ACL", "SAVE") == b"OK"
        assert aclfile.read_text() == good
        assert [p.name for p in aclfile.parent.iterdir() if p.name.startswith(".acl-")] == []


# --------------------------------------------------------------------------
# Patterns are matched in linear time
# --------------------------------------------------------------------------

def _signed(byte: int) -> int:
    return byte - 256 if byte >= 0x80 else byte


def stringmatchlen(pattern: bytes, string: bytes) -> bool:
    """Redis's ``stringmatchlen`` (util.c, case-sensitive), line for line:
    the reference answer, backtracking and all (short names only)."""
    p, s = 0, 0
    plen, slen = len(pattern), len(string)
    while plen and slen:
        ch = pattern[p]
        if ch == 0x2A:  # *
            while plen > 1 and pattern[p + 1] == 0x2A:
                p += 1
                plen -= 1
            if plen == 1:
                return True
            while slen:
                if stringmatchlen(pattern[p + 1:p + plen], string[s:s + slen]):
                    return True
                s += 1
                slen -= 1
            return False
        if ch == 0x3F:  # ?
            s += 1
            slen -= 1
        elif ch == 0x5B:  # [
            p += 1
            plen -= 1
            negate = plen > 0 and pattern[p] == 0x5E
            if negate:
                p += 1
                plen -= 1
            match = False
            while True:
                if plen >= 2 and pattern[p] == 0x5C:
                    p += 1
                    plen -= 1
                    if pattern[p] == string[s]:
                        match = True
                elif plen > 0 and pattern[p] == 0x5D:
                    break
                elif plen == 0:
                    p -= 1
                    plen += 1
                    break
                elif plen >= 3 and pattern[p + 1] == 0x2D:
                    low, high = sorted((_signed(pattern[p]), _signed(pattern[p + 2])))
                    p += 2
                    plen -= 2
                    if low <= _signed(string[s]) <= high:
                        match = True
                elif pattern[p] == string[s]:
                    match = True
                p += 1
                plen -= 1
            if negate:
                match = not match
            if not match:
                return False
            s += 1
            slen -= 1
        else:
            if ch == 0x5C and plen >= 2:  # \x
                p += 1
                plen -= 1
            if pattern[p] != string[s]:
                return False
            s += 1
            slen -= 1
        p += 1
        plen -= 1
        if slen == 0:
            while plen and pattern[p] == 0x2A:
                p += 1
                plen -= 1
            break
    return plen == 0 and slen == 0


def test_the_linear_matcher_agrees_with_redis_stringmatchlen() -> None:
    rng = random.Random(7)
    pattern_bytes, name_bytes = b"ab-*?[]^\\\xff", b"ab-[]^\\*\xff"
    for _ in range(100_000):
        pattern = bytes(rng.choice(pattern_bytes) for _ in range(rng.randint(0, 8)))
        name = bytes(rng.choice(name_bytes) for _ in range(rng.randint(0, 9)))
        assert Glob(pattern).matches(name) is stringmatchlen(pattern, name), (pattern, name)
    # The cases where Redis's rules are not the obvious ones.
    for pattern, name, expected in [(b"[\\]]", b"]", True), (b"[\\]]", b"\\]", False),
                                    (b"[]]*", b"]x", False), (b"[a-]", b"-", False),
                                    (b"[abc", b"b", True), (b"*", b"", False),
                                    (b"a*", b"a", True), (b"[]", b"]", False)]:
        assert stringmatchlen(pattern, name) is expected, (pattern, name)
        assert Glob(pattern).matches(name) is expected, (pattern, name)


def test_a_pattern_with_stars_does_not_freeze_the_node(server_factory) -> None:
    """``~*-*-jobs`` against a 40,000-byte name froze the node for 12 s (the
    time grew with the square of the length); a 1,000,000-byte name now
    answers at once, and other clients are served meanwhile."""
    node = server_factory("--max-queue-name-len", "2mb")
    name = b"-" * 1_000_000 + b"x"
    with Resp(node.port) as admin:
        assert admin.call("ACL", "SETUSER", "t", "on", ">pw", "~*-*-*-*-jobs", "+@all") == b"OK"
    with Resp(node.port, timeout=10) as tenant, Resp(node.port, timeout=10) as other:
        assert tenant.call("AUTH", "t", "pw") == b"OK"
        for _ in range(3):  # a backtracking matcher would take hours on the first one
            assert_error(tenant, ("QLEN", name),
                         exact="NOPERM User t has no permissions to access the '"
                               + "-" * 128 + "' queue")
            assert other.call("PING") == b"PONG"
        assert tenant.call("QLEN", b"a-b-c-d-jobs") == 0


# --------------------------------------------------------------------------
# The implicit dead-letter queue is held to the user's patterns
# --------------------------------------------------------------------------

def test_the_implicit_dead_letter_queue_is_checked(server_factory) -> None:
    node = server_factory()
    with Resp(node.port) as admin:
        admin.call("ACL", "SETUSER", "team", "on", ">pw", "~orders", "+@all")
        admin.call("ACL", "SETUSER", "team2", "on", ">pw", "~orders", "~orders:dead", "+@all")
        with Resp(node.port) as team:
            assert team.call("AUTH", "team", "pw") == b"OK"
            jobs = admin.call("INFO", "jobs")
            assert_error(team, ("ADDJOB", "orders", "x", 0, "RETRY", 1, "MAXDELIVERIES", 1),
                         exact="NOPERM User team has no permissions to access the "
                               "'orders:dead' queue")
            replies = team.call("ADDJOBS", "orders", 0, "RETRY", 1, "MAXDELIVERIES", 1,
                                "BODIES", "a", "b")  # one answer per job, as for DEADLETTER
            assert [str(reply) for reply in replies] == [
                "NOPERM User team has no permissions to access the 'orders:dead' queue"] * 2
            assert admin.call("INFO", "jobs") == jobs  # nothing stored
            assert JOB_ID.match(team.call("ADDJOB", "orders", "x", 0))  # no dead letters
        with Resp(node.port) as team2:
            assert team2.call("AUTH", "team2", "pw") == b"OK"
            job_id = team2.call("ADDJOB", "orders", "y", 0, "RETRY", 1, "MAXDELIVERIES", 1)
            assert JOB_ID.match(job_id)
            assert team2.call("QLEN", "orders") == 2


# --------------------------------------------------------------------------
# The verdict cache is bounded in bytes
# --------------------------------------------------------------------------

def test_the_verdict_cache_is_bounded_in_bytes() -> None:
    """30 names of 10 MB held 320 MB in the cache, for good; now names are
    cached only while short, and the cache stays under 64 KB."""
    user = User("t")
    user.apply("~tenant:*", acl_catalog())
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(30):
            name = b"tenant:" + bytes([65 + i % 26]) * 10_000_000
            assert user.may_access(name)
            del name
        for i in range(100_000):  # many short names
            user.may_access(b"tenant:%d" % i)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 512 * 1024, held
    assert user.may_access(b"tenant:1") and not user.may_access(b"other")
