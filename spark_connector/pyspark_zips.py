"""PySpark's zips on the path of Spark's Python processes, and removing them.

    python -m spark_connector.pyspark_zips            # lists them, says whether they can go
    python -m spark_connector.pyspark_zips --remove   # for an image or a venv

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and its py4j zip first on
the path of every Python process it starts that is not forked from a warm
daemon: the driver side of each streaming query above all.  Python keeps
no bytecode for modules imported from a zip, so each of those processes
compiles the PySpark it imports again: ~0.7 s of CPU against ~0.3 s from
installed bytecode, most of a streaming query's start-up.  In a pip install
of PySpark the same modules are in site-packages with their bytecode, and
Python skips a path entry whose file does not exist; without the zips,
Spark's processes load that bytecode instead.

Remove them only from a pip install of PySpark (``--remove`` checks that
``SPARK_HOME`` is the installed package's own directory, so the zips are a
second copy of what is installed) and not on a YARN client: YARN ships
``pyspark.zip`` to its containers and fails without it.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "refusal", "spark_home", "zips"]


def spark_home() -> Path:
    """The ``SPARK_HOME`` Spark runs from: the environment's, or the pip install's
    (PySpark's package directory, which holds Spark's jars and scripts)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def zips(home: Path) -> list[Path]:
    """The zips Spark puts on its Python processes' path, those that exist."""
    lib = home / "python" / "lib"
    return sorted(p for p in [lib / "pyspark.zip", *lib.glob("py4j-*-src.zip")] if p.is_file())


def _installed(name: str, search: list[str]) -> Path | None:
    """Where package ``name`` is installed on ``search`` (a regular package only)."""
    spec = importlib.machinery.PathFinder.find_spec(name, search)
    if spec is None or spec.origin is None:  # absent, or a namespace of stray folders
        return None
    return Path(spec.origin).resolve().parent


def refusal(home: Path, found: Sequence[Path], path: Sequence[str] | None = None) -> str | None:
    """Why the zips ``found`` under ``home`` must stay (None: they can go).

    They can go only where ``home`` is the installed PySpark's own
    directory and py4j is installed beside it: then the zips are a second
    copy of the packages Spark's processes find anyway.  ``path`` is the
    search path (default ``sys.path``, the zips themselves left out).
    """
    skipped = {os.path.realpath(p) for p in found}
    search = [p for p in (sys.path if path is None else path)
              if p and os.path.realpath(p) not in skipped]
    pyspark = _installed("pyspark", search)
    missing = [name for name, where in [("pyspark", pyspark), ("py4j", _installed("py4j", search))]
               if where is None]
    if missing:
        return (f"{', '.join(missing)} would no longer be importable (only in the zips); "
                "install them as packages first (pip install pyspark)")
    if pyspark != home.resolve():
        return (f"{home} is not the installed PySpark ({pyspark}): its zips are its own "
                "copy of PySpark, which may differ from the installed one")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_connector.pyspark_zips",
        description="List (or remove) the zips of PySpark that Spark's Python processes "
                    "compile again at every start.")
    parser.add_argument("--remove", action="store_true",
                        help="delete them (refused unless SPARK_HOME is a pip install of "
                             "PySpark, whose packages are installed beside the zips)")
    parser.add_argument("--spark-home", type=Path, default=None,
                        help="default: $SPARK_HOME, else the pip-installed pyspark's")
    args = parser.parse_args(argv)
    home = args.spark_home or spark_home()
    found = zips(home)
    if not found:
        print(f"{home}: no zips under python/lib; Spark's Python processes load "
              "the installed bytecode")
        return 0
    for path in found:
        print(f"{path} ({path.stat().st_size:,} bytes)")
    why = refusal(home, found)
    if not args.remove:
        print(f"keep them: {why}" if why else "a second copy of the installed packages: "
              "--remove deletes the zips")
        return 0
    if why:
        print(f"refused: {why}", file=sys.stderr)
        return 1
    for path in found:
        path.unlink()
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
