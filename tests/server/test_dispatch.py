"""How a command finds its handler and its options: any letter case.

The original compares command names and options with ``strcasecmp``.  The
node compares them with the capital and the lower-case spelling first (what
clients send) and remembers the last command it looked up; these tests pin
that every spelling still gets the same answer, and that the remembered
command never outlives a change of the table.
"""

from __future__ import annotations

import pytest
import redis

from disque.commands.registry import (
    COMMANDS,
    OptionName,
    command,
    is_option,
    lookup,
)


@pytest.mark.parametrize("arg, expected", [
    (b"withcounters", True),
    (b"WITHCOUNTERS", True),
    (b"WithCounters", True),
    (b"wITHCOUNTERs", True),
    (b"withcounter", False),
    (b"withcounterss", False),
    (b"withcountert", False),
    (b"", False),
    (b"WITHCOUNTERS\x00", False),
    (b"w\xc3thcounters", False),
])
def test_is_option_in_any_letter_case(arg: bytes, expected: bool) -> None:
    assert is_option(arg, OptionName(b"withcounters")) is expected


def test_lookup_in_any_letter_case_and_after_an_unknown_name() -> None:
    ping = COMMANDS[b"ping"]
    for name in (b"ping", b"PING", b"Ping", b"ping", b"no-such-command", b"pInG", b"PING"):
        assert lookup(name) is (None if name == b"no-such-command" else ping)
    assert lookup(b"no-such-command") is None


def test_a_command_declared_after_a_lookup_is_found() -> None:
    """A name looked up (and unknown) just before it is declared is found
    afterwards: declaring a command forgets the remembered lookup."""
    name = b"dispatch-test-command"
    assert lookup(name) is None
    assert lookup(b"ping") is COMMANDS[b"ping"]

    def handler(state: object, client: object, argv: list[bytes]) -> bytes:
        return b"first"

    def replacement(state: object, client: object, argv: list[bytes]) -> bytes:
        return b"second"

    try:
        command(name.decode(), 1)(handler)
        found = lookup(name)
        assert found is not None and found.handler is handler
        assert lookup(name) is found  # remembered
        command(name.decode(), 1)(replacement)
        replaced = lookup(name)
        assert replaced is not None and replaced.handler is replacement
    finally:
        COMMANDS.pop(name, None)
        COMMANDS.pop(name.upper(), None)
        assert lookup(b"ping") is COMMANDS[b"ping"]  # the test's command is not remembered


def test_options_in_any_letter_case_get_the_same_answers(r: redis.Redis) -> None:
    for spelling in ("REPLICATE", "replicate", "Replicate", "rEPLICATE"):
        job_id = r.execute_command("ADDJOB", "dispatch-q", "x", 0, spelling, 1,
                                   "Ttl", 60, "rEtRy", 5, "maxLEN", 100)
        assert job_id.startswith(b"D-")
    for spelling in ("FROM", "from", "From", "fROM"):
        reply = r.execute_command("GETJOB", "nOhAnG", "Count", 1, "WithCounters",
                                  "TIMEOUT", 10, spelling, "dispatch-q")
        assert reply is not None and len(reply) == 1
        assert reply[0][0] == b"dispatch-q" and b"nacks" in reply[0]
    body = r.execute_command("ADDJOBS", "dispatch-bulk", 0, "Bodies", "a", "b")
    assert len(body) == 2
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("GETJOB", "NOHANG", "FROMX", "dispatch-q")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("ADDJOB", "dispatch-q", "x", 0, "TTLS", 60)
