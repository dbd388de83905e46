"""One zip of the connector and the client, for Spark's Python path on every node.

    python -m spark_connector.bundle [OUTPUT]     # default: disque-spark-<version>.zip

Give it to ``--py-files`` / ``spark.submit.pyFiles`` / ``SparkContext.addPyFile``,
or to a Spark Connect session with ``spark.addArtifacts(path, pyfile=True)``.
It holds what executors import and nothing else: ``spark_connector``,
``pyspark_disque``, the client (``disque/__init__.py``, ``disque/_native.py``,
``disque/exceptions.py``, ``disque/client/``) and redis-py, which the client
speaks RESP through. Not the node, nor its compiled modules: importing the
client never loads them (``disque/_native.py``).

What it does not hold must already be in the Python the nodes run for
Spark: pyarrow and numpy (``pyspark[sql]`` needs them too), and boto3 where
``fetchMode=executor`` stages on S3.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CLIENT_FILES", "build", "main"]

#: The parts of the ``disque`` package the client needs (paths in the package).
CLIENT_FILES = ("__init__.py", "_native.py", "exceptions.py", "py.typed", "rendezvous.py",
                "client")


def _origin(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"cannot bundle {module}: it is not installed here")
    return Path(spec.origin)


def _files(root: Path, parts: tuple[str, ...] | None = None) -> Iterator[Path]:
    """The sources under ``root`` (only ``parts`` of it, if given)."""
    for part in parts or (p.name for p in root.iterdir()):
        path = root / part
        if path.is_dir():
            yield from (f for f in sorted(path.rglob("*"))
                        if f.is_file() and "__pycache__" not in f.parts
                        and f.suffix in (".py", ".typed"))
        elif path.is_file() and path.suffix in (".py", ".typed"):
            yield path


def _members() -> Iterator[tuple[Path, str]]:
    """(file, name in the zip) of everything the bundle holds."""
    lookup = _origin("pyspark_disque")
    yield lookup, lookup.name
    for package, parts in (("spark_connector", None), ("disque", CLIENT_FILES),
                           ("redis", None)):
        root = _origin(package).parent
        for path in _files(root, parts):
            yield path, f"{package}/{path.relative_to(root).as_posix()}"


def build(output: Path) -> Path:
    """Write the bundle to ``output`` (replaced if it exists) and return it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, name in _members():
            archive.write(path, name)
    tmp.replace(output)
    return output


def main(argv: list[str] | None = None) -> int:
    from disque import __version__

    parser = argparse.ArgumentParser(
        prog="python -m spark_connector.bundle",
        description="Zip the Disque Spark connector and client for --py-files, "
                    "spark.submit.pyFiles or a Spark Connect session's addArtifacts.")
    parser.add_argument("output", nargs="?", type=Path,
                        default=Path(f"disque-spark-{__version__}.zip"))
    args = parser.parse_args(argv)
    print(build(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
