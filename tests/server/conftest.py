"""Fixtures shared by the single-node tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import DisqueProcess


@pytest.fixture(scope="module")
def node(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[DisqueProcess]:
    """One node for a whole test module: its tests use their own queues or
    flush what they need, so they need not pay a node start each."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    proc = DisqueProcess(Path(tmp_path_factory.mktemp(name)))
    proc.start()
    yield proc
    proc.kill()
