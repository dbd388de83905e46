"""``format("disque")`` works wherever the package is installed, not only in the checkout.

PySpark finds Python data sources by listing top-level modules named
``pyspark_*`` with ``pkgutil.iter_modules()``.  An import hook (setuptools'
default for editable installs of a flat layout) makes ``import pyspark_disque``
work but is invisible to that listing, so the short name was found only when
the current directory was the repository root.  These tests run from a
directory outside the checkout, in a fresh interpreter, as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from disque import _native
from disque.client import Client

ROOT = Path(__file__).resolve().parents[2]


def outside_env() -> dict[str, str]:
    """The environment minus anything that would put the checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def run_outside(tmp_path: Path, code: str, timeout: float) -> subprocess.CompletedProcess:
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    assert ROOT not in workdir.parents
    script = workdir / "app.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], cwd=workdir, env=outside_env(),
                          capture_output=True, text=True, timeout=timeout)


def pip(cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--quiet", *args], cwd=cwd,
                            env={**os.environ, **(env or {})},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lookup_module_is_listed_outside_the_checkout(tmp_path: Path) -> None:
    result = run_outside(tmp_path, """
        import pkgutil
        names = {m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")}
        print("pyspark_disque" in names)
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True", (
        "pkgutil.iter_modules() (what PySpark's data source lookup uses) does not list "
        "pyspark_disque outside the checkout")


def test_short_name_found_by_spark_outside_the_checkout(tmp_path: Path, server) -> None:
    # No register() call: only the installed module can make the name known.
    result = run_outside(tmp_path, f"""
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[1]").appName("short-name")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            (spark.createDataFrame([("a",), ("b",), ("c",)], "body string")
             .write.format("disque").option("nodes", "127.0.0.1:{server.port}")
             .option("queue", "short").mode("append").save())
            rows = (spark.read.format("disque").option("nodes", "127.0.0.1:{server.port}")
                    .option("queues", "short").option("bodyFormat", "string").load()
                    .select("body").collect())
            print(sorted(r.body for r in rows))
        finally:
            spark.stop()
    """, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['a', 'b', 'c']"
    with Client(f"127.0.0.1:{server.port}") as client:
        assert client.qlen("short") == 3


def test_regular_install_ships_the_lookup_module(tmp_path: Path) -> None:
    """A wheel installs pyspark_disque as a top-level module that the listing sees."""
    # Built from a copy: an in-tree build would leave build/ in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".*_cache", "demo-output", ".venv",
        "venv", "*.so"))
    # Interpreted: the module list is the subject here, and compiling the
    # core would add 100 s of mypyc (CI's own install compiles it and checks
    # that the compiled core runs).
    pip(tmp_path, "wheel", "--no-deps", "-w", str(tmp_path / "wheel"), str(source),
        env={_native.ENV_VAR: "1"})
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    target = tmp_path / "site"
    pip(tmp_path, "install", "--no-deps", "--target", str(target), str(wheel))
    # -S: no site-packages .pth processing, so the editable install of the
    # checkout cannot answer; only the wheel's files are on the path.
    result = subprocess.run(
        [sys.executable, "-S", "-c",
         "import pkgutil; print([m.module_finder.path for m in pkgutil.iter_modules()"
         " if m.name == 'pyspark_disque'])"],
        cwd=tmp_path, env={**outside_env(), "PYTHONPATH": str(target)},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr([str(target)])
