"""disque/client/sync.py is generated from aio.py by scripts/unasync.py.

The first test is the check that keeps it so: it regenerates sync.py in
memory and fails, with the command to run, when the file differs.  The
others pin the generator's rules on small inputs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load_unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unasync = _load_unasync()


def test_sync_client_is_generated_from_the_async_one() -> None:
    expected = unasync.generate(unasync.SOURCE.read_text())
    current = unasync.TARGET.read_text()
    assert current == expected, (
        f"disque/client/sync.py is not what aio.py generates: run `{unasync.COMMAND}`")


def test_the_generated_file_says_so() -> None:
    head = unasync.TARGET.read_text().splitlines()[:3]
    assert "Generated from disque/client/aio.py" in head[0]
    assert unasync.COMMAND in "\n".join(head)


def _gen(source: str) -> list[str]:
    return unasync.generate(source).splitlines()[len(unasync.HEADER.splitlines()):]


def test_async_words_become_sync_ones() -> None:
    out = _gen('''\
class AsyncThing:
    """The asyncio thing for tasks: ``async with AsyncThing()``."""
    async def __aenter__(self) -> AsyncThing:
        async with self._lock:
            await asleep(1)
            async for x in self._rows():
                await aclose_connection(await self._conn(redis.asyncio.Connection))
''')
    assert out == [
        "class Thing:",
        '    """The synchronous thing for threads: ``with Thing()``."""',
        "    def __enter__(self) -> Thing:",
        "        with self._lock:",
        "            sleep(1)",
        "            for x in self._rows():",
        "                close_connection(self._conn(redis.Connection))",
    ]


def test_words_that_only_look_async_stay() -> None:
    source = "def f(async_: bool, awaiting: int, asyncio_like: str, aread_replyx: int): ...\n"
    assert _gen(source) == [source.rstrip("\n")]


def test_continuation_lines_follow_their_bracket() -> None:
    out = _gen('''\
    async def method(self, a: int,
                     b: int) -> None:
        x = await call(first,
                       second, "(", f"{a})",
                       nested(await one,
                              two))
        y = call(
            hanging)
''')
    assert out == [
        "    def method(self, a: int,",
        "               b: int) -> None:",
        "        x = call(first,",
        '                 second, "(", f"{a})",',
        "                 nested(one,",
        "                        two))",
        "        y = call(",
        "            hanging)",
    ]


def test_brackets_inside_docstrings_are_not_brackets() -> None:
    out = _gen('''\
    async def f(self) -> None:
        """A docstring with an open ( bracket
        and a line after it."""
        await g(1,
                2)
''')
    assert out[1:] == [
        '        """A docstring with an open ( bracket',
        '        and a line after it."""',
        "        g(1,",
        "          2)",
    ]


def test_renamed_imports_are_sorted_again() -> None:
    out = _gen("from collections.abc import AsyncIterator, Callable, Iterable, Sequence\n"
               "from x import b, a\n")
    # Only lines the rules changed are sorted: the second is left as written.
    assert out == ["from collections.abc import Callable, Iterable, Iterator, Sequence",
                   "from x import b, a"]


def test_the_sources_leading_comment_gives_way_to_the_header() -> None:
    text = unasync.generate("# hand-written source\n# of the client\n\"\"\"Doc.\"\"\"\n")
    assert text == unasync.HEADER + '"""Doc."""\n'
