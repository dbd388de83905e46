"""The type checker's verdict is part of the build: mypyc compiles the core
from its annotations, so the package must type-check, and the compiled
modules must pass ``mypy --strict``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from disque._native import COMPILED_MODULES, source_path

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mypy", reason="mypy is in the dev extra: pip install -e '.[dev]'")


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_the_package_type_checks() -> None:
    result = _mypy("disque")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_spark_connector_type_checks() -> None:
    pytest.importorskip("pyspark", reason="needs the 'spark' extra: pip install -e '.[spark]'")
    result = _mypy("spark_connector")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compiled_modules_pass_mypy_strict() -> None:
    files = [str(source_path(m).relative_to(ROOT)) for m in COMPILED_MODULES]
    result = _mypy("--strict", "--follow-imports=silent", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_fault_harness_type_checks() -> None:
    result = _mypy("faults")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_benchmarks_jobs_and_scripts_type_check() -> None:
    result = _mypy("benchmarks", "jobs", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr
