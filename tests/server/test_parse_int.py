"""``parse_int``, the number parser behind every numeric argument, as a unit.

It reads up to 18 digits itself (compiled, ``int()`` of bytes was a
Python-level call) and hands longer ones to ``int()``: both paths must keep
the original's string2ll rules and the error texts commands rely on.
"""

from __future__ import annotations

import pytest

from disque.commands.registry import (
    INT64_MAX,
    INT64_MIN,
    INT_ERROR,
    CommandError,
    parse_int,
    parse_timeout_ms,
)


@pytest.mark.parametrize("raw, value", [
    (b"0", 0),
    (b"7", 7),
    (b"-7", -7),
    (b"10", 10),
    (b"123456789012345678", 123456789012345678),         # 18 digits: the digit loop
    (b"-123456789012345678", -123456789012345678),
    (b"999999999999999999", 999999999999999999),
    (b"1234567890123456789", 1234567890123456789),       # 19 digits: int()
    (b"9223372036854775807", INT64_MAX),
    (b"-9223372036854775808", INT64_MIN),
])
def test_well_formed_numbers(raw: bytes, value: int) -> None:
    assert parse_int(raw) == value


@pytest.mark.parametrize("raw", [
    b"", b"-", b"+1", b" 1", b"1 ", b"1\n", b"01", b"00", b"-0", b"-01", b"1-", b"--1",
    b"1.5", b"1e3", b"0x10", b"12a", b"a", "\u0661".encode(),  # an Arabic-Indic digit
    b"1" * 17 + b"a", b"1" * 18 + b"a", b"-" + b"1" * 18 + b"a",
])
def test_malformed_numbers_get_the_callers_text(raw: bytes) -> None:
    with pytest.raises(CommandError) as err:
        parse_int(raw, "ERR COUNT is not a number")
    assert err.value.message == "ERR COUNT is not a number"


def test_beyond_64_bits_gets_the_range() -> None:
    for raw in (b"9223372036854775808", b"9" * 30, b"-9223372036854775809", b"-" + b"9" * 30):
        with pytest.raises(CommandError) as err:
            parse_int(raw)
        assert err.value.message == (
            f"ERR value is out of range, must be between {INT64_MIN} and {INT64_MAX}")


def test_bounds_and_their_texts() -> None:
    assert parse_int(b"1", "ERR TTL must be a number > 0", 1, 10) == 1
    assert parse_int(b"10", "ERR TTL must be a number > 0", 1, 10) == 10
    with pytest.raises(CommandError) as err:
        parse_int(b"0", "ERR TTL must be a number > 0", 1, 10)
    assert err.value.message == "ERR TTL must be a number > 0"
    with pytest.raises(CommandError) as err:
        parse_int(b"11", "ERR TTL must be a number > 0", 1, 10, "ERR TTL too big")
    assert err.value.message == "ERR TTL too big"
    with pytest.raises(CommandError) as err:
        parse_int(b"11", "ERR TTL must be a number > 0", 1, 10)
    assert err.value.message == "ERR TTL must be a number > 0 and at most 10"
    with pytest.raises(CommandError) as err:
        parse_int(b"-5", INT_ERROR, 0, 100)
    assert err.value.message == "ERR value is out of range, must be between 0 and 100"


def test_timeouts() -> None:
    assert parse_timeout_ms(b"0") == 0
    assert parse_timeout_ms(b"5000") == 5000
    for raw, text in ((b"-1", "ERR timeout is negative"),
                      (b"x", "ERR timeout is not an integer or out of range"),
                      (b"9" * 25, f"ERR timeout is out of range, must be between 0 and "
                                  f"{INT64_MAX} (milliseconds)")):
        with pytest.raises(CommandError) as err:
            parse_timeout_ms(raw)
        assert err.value.message == text
