"""``python -m spark_connector.bundle``: the zip for ``--py-files`` and Connect artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from disque import __version__
from disque._native import COMPILED_MODULES
from spark_connector import bundle

ROOT = Path(__file__).resolve().parents[2]


def test_the_zip_holds_the_connector_and_the_client_only(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "spark_connector.bundle"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    made = tmp_path / f"disque-spark-{__version__}.zip"
    assert out.stdout.strip() == str(made.relative_to(tmp_path))
    assert made.name in (ROOT / "docs" / "SPARK.md").read_text()  # the name the docs use
    names = set(zipfile.ZipFile(made).namelist())
    assert {"pyspark_disque.py", "spark_connector/source.py", "disque/client/sync.py",
            "redis/client.py"} <= names
    disque_files = {n for n in names if n.startswith("disque/")}
    # The client and what it imports (rendezvous: the groups' home nodes), not the node.
    assert disque_files <= {"disque/__init__.py", "disque/_native.py", "disque/exceptions.py",
                            "disque/rendezvous.py"} | {
        n for n in disque_files if n.startswith("disque/client/")}
    assert not [n for n in names if n.endswith((".so", ".pyc"))]


def test_the_zip_alone_runs_the_client(tmp_path: Path, server) -> None:
    """First on the path (as on an executor), it is what gets imported, and works."""
    made = bundle.build(tmp_path / "b.zip")
    code = f"""
import json, sys
import spark_connector, pyspark_disque
from disque.client import Client
with Client("127.0.0.1:{server.port}") as client:
    job = client.add_job("zipped", "hello")
core = [m for m in {list(COMPILED_MODULES)!r} if m in sys.modules]
print(json.dumps({{"files": [spark_connector.__file__, Client.__module__,
                             sys.modules["disque.client"].__file__,
                             sys.modules["redis"].__file__],
                  "core": core, "job": bool(job)}}))
"""
    env = {**os.environ, "PYTHONPATH": str(made)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["core"] == [] and seen["job"]
    spark_file, module, client_file, redis_file = seen["files"]
    assert module == "disque.client.sync"
    for path in (spark_file, client_file, redis_file):
        assert path.startswith(str(made) + os.sep), path
