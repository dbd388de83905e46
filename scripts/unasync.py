"""Generate the synchronous client, disque/client/sync.py, from the asyncio one.

disque/client/aio.py is the one hand-written copy of the client; sync.py is
this script's output, as encode/httpcore generates its sync code (its
``scripts/unasync.py``).  Each line of aio.py is rewritten by the
substitutions in ``RULES``, in order, on whole words, in code, comments
and docstrings alike:

* ``async def`` / ``async with`` / ``async for`` lose ``async``, ``await``
  goes, ``__aenter__``/``__aexit__`` become ``__enter__``/``__exit__``;
* ``AsyncX`` becomes ``X`` (``AsyncClient`` -> ``Client``,
  ``AsyncIterator`` -> ``Iterator``, ``AsyncLock`` -> ``Lock``) and the
  asynchronous helpers of disque/client/_io.py lose their ``a``
  (``aread_reply`` -> ``read_reply``, ...);
* ``redis.asyncio`` becomes ``redis``, ``asynchronous=True`` becomes
  ``asynchronous=False``;
* ``asyncio`` becomes ``synchronous`` and ``task(s)`` becomes ``thread(s)``:
  words of the docstrings (aio.py's code uses neither), so write them
  such that both readings are true.

Then two layout fixes, so the output needs no hand-editing:

* a continuation line aligned with an open bracket moves left by what the
  rewrite removed before that bracket;
* the names of a rewritten one-line ``from m import a, b`` are sorted again
  (as ruff's isort does: constants, classes, then the rest).

aio.py's leading comment lines (which say it is the source) are replaced by
``HEADER``.  What cannot be written the same way in both flavours is not
here: it is a pair of names in disque/client/_io.py.

    python scripts/unasync.py          # rewrite disque/client/sync.py
    python scripts/unasync.py --check  # exit 1 if sync.py is not current

tests/client/test_generated.py runs the check in the test suite.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "disque" / "client" / "aio.py"
TARGET = ROOT / "disque" / "client" / "sync.py"
COMMAND = "python scripts/unasync.py"

HEADER = f"""\
# Generated from disque/client/aio.py by scripts/unasync.py: do not edit.
# Edit aio.py and run `{COMMAND}` (tests/client/test_generated.py
# fails while this file is not current).
# ruff: noqa: UP028 - aio.py's async generator cannot `yield from`: its loop stays
"""

#: (pattern, replacement), applied in this order to every line.
RULES: list[tuple[str, str]] = [
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
    (r"\b__a(enter|exit)__\b", r"__\1__"),
    (r"\bAsync(?=[A-Z])", ""),
    (r"\ba(?=(sleep|read_reply|close_connection)\b)", ""),
    (r"\bredis\.asyncio\b", "redis"),
    (r"\basynchronous=True\b", "asynchronous=False"),
    (r"\basyncio\b", "synchronous"),
    (r"\btask(s?)\b", r"thread\1"),
]
COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in RULES]

FROM_IMPORT = re.compile(r"^(\s*from \S+ import )([\w, ]+)$")


def rewrite(line: str) -> str:
    for pattern, replacement in COMPILED:
        line = pattern.sub(replacement, line)
    return line


def sort_names(line: str) -> str:
    """``from m import b, a`` with the names in isort's order."""
    match = FROM_IMPORT.match(line)
    if match is None:
        return line
    names = [name.strip() for name in match.group(2).split(",")]

    def key(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
        return kind, name.lower()

    return match.group(1) + ", ".join(sorted(names, key=key))


def brackets(line: str, quote: str | None) -> tuple[list[tuple[int, str]], str | None]:
    """The brackets of ``line`` outside strings and comments, with their
    columns, and the string still open at the end of the line (``quote``:
    the one open at its start, a triple quote or None)."""
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(line):
        if quote is not None:
            if line.startswith("\\", i):
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            i += 1
            continue
        char = line[i]
        if char == "#":
            break
        if char in "'\"":
            quote = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else char
            i += len(quote)
            continue
        if char in "([{)]}":
            found.append((i, char))
        i += 1
    if quote is not None and len(quote) == 1:
        quote = None  # a one-quote string cannot go on to the next line
    return found, quote


def realign(source: list[str], output: list[str]) -> list[str]:
    """Move continuation lines with the brackets they are aligned to.

    The rules remove words but never a bracket or a quote, so a source line
    and its rewrite hold the same brackets in the same order: each open
    bracket is known by its column in both.
    """
    result: list[str] = []
    # For each open bracket: the column just after it, in source and output.
    open_brackets: list[tuple[int, int]] = []
    quote: str | None = None
    for src, out in zip(source, output, strict=True):
        if open_brackets and quote is None and out.strip():
            indent = len(src) - len(src.lstrip())
            for src_column, out_column in reversed(open_brackets):
                if indent == src_column:
                    out = " " * out_column + out.lstrip()
                    break
        src_found, end_quote = brackets(src, quote)
        out_found, _ = brackets(out, quote)
        if [char for _, char in src_found] != [char for _, char in out_found]:
            raise ValueError(f"a rule changed the brackets of this line of aio.py: {src!r}")
        for (src_column, char), (out_column, _) in zip(src_found, out_found, strict=True):
            if char in "([{":
                open_brackets.append((src_column + 1, out_column + 1))
            else:
                open_brackets.pop()
        quote = end_quote
        result.append(out)
    return result


def generate(source: str) -> str:
    """sync.py's text for aio.py's ``source``."""
    lines = source.splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    output = []
    for line in lines:
        new = rewrite(line)
        output.append(sort_names(new) if new != line else new)
    return HEADER + "\n".join(realign(lines, output)) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that sync.py is current (exit 1 if not)")
    args = parser.parse_args()
    expected = generate(SOURCE.read_text())
    if args.check:
        if TARGET.read_text() != expected:
            print(f"{TARGET.relative_to(ROOT)} is not current: run `{COMMAND}`",
                  file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
