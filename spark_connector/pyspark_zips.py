"""PySpark's zips on the path of Spark's Python processes, and removing them.

    python -m spark_connector.pyspark_zips            # what is there, what it costs
    python -m spark_connector.pyspark_zips --remove   # for an image or a venv

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and its py4j zip first on
the path of every Python process it starts: the driver side of each
streaming query, each planner (a source's schema, a batch's partitions),
each worker daemon.  Python keeps no bytecode for modules imported from a
zip, so each of those processes compiles the PySpark it imports again: ~0.6 s
of CPU every time, most of a streaming query's start-up.  In a pip install
of PySpark the same modules are in site-packages with their bytecode, and
Python skips a path entry whose file does not exist; without the zips,
Spark's processes load that bytecode instead.

Remove them only where PySpark and py4j are also installed as packages (a
pip install: ``--remove`` checks) and the Spark is not a YARN client: YARN
ships ``pyspark.zip`` to its containers and fails without it.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "only_in_zips", "spark_home", "zips"]


def spark_home() -> Path:
    """The ``SPARK_HOME`` Spark runs from: the environment's, or the pip install's
    (PySpark's package directory, which holds Spark's jars and scripts)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def zips(home: Path) -> list[Path]:
    """The zips Spark puts on its Python processes' path, those that exist."""
    return sorted((home / "python" / "lib").glob("*.zip"))


def only_in_zips(found: Sequence[Path], path: Sequence[str] | None = None) -> list[str]:
    """Of pyspark and py4j, those importable only from ``found`` (the zips).

    ``path`` is the search path (default ``sys.path``); entries that are one
    of the zips do not count.
    """
    skipped = {os.path.realpath(p) for p in found}
    search = [p for p in (sys.path if path is None else path)
              if os.path.realpath(p or ".") not in skipped]
    return [name for name in ("pyspark", "py4j")
            if importlib.machinery.PathFinder.find_spec(name, search) is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_connector.pyspark_zips",
        description="List (or remove) the zips of PySpark that Spark's Python processes "
                    "compile again at every start.")
    parser.add_argument("--remove", action="store_true",
                        help="delete them (refused unless pyspark and py4j are installed "
                             "as packages too)")
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
    missing = only_in_zips(found)
    if not args.remove:
        advice = (f"only in the zips: {', '.join(missing)}; keep them" if missing
                  else "also installed as packages: --remove deletes the zips")
        print(advice)
        return 0
    if missing:
        print(f"refused: {', '.join(missing)} would no longer be importable (only in the "
              "zips); install them as packages first (pip install pyspark)", file=sys.stderr)
        return 1
    for path in found:
        path.unlink()
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
