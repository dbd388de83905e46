"""What the source distribution and the wheel carry.

Built here with ``python -m build``, interpreted
(``DISQUE_INTERPRETED=1``: the contents do not depend on the compiled core,
whose build tests/test_native.py covers), into a temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build(kind: str, out: Path) -> Path:
    """``python -m build --sdist|--wheel``: the PyPA front end, in an isolated
    environment with pyproject.toml's build requirements, as a release is built."""
    pytest.importorskip("build", reason="needs the 'dev' extra (the build front end)")
    result = subprocess.run([sys.executable, "-m", "build", f"--{kind}", "--outdir", str(out),
                             str(ROOT)], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "DISQUE_INTERPRETED": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = out.iterdir()
    return built


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory) -> set[str]:
    path = _build("sdist", tmp_path_factory.mktemp("sdist"))
    with tarfile.open(path) as tar:
        top = path.name.removesuffix(".tar.gz")
        return {name.removeprefix(top + "/") for name in tar.getnames()}


def test_the_sdist_carries_what_the_readme_links_and_runs(sdist_names: set[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
              if not re.match(r"[a-z]+://", target)}
    assert linked, "the README links nothing?"
    for target in linked:
        path = ROOT / target
        wanted = ({str(p.relative_to(ROOT)) for p in path.rglob("*") if p.is_file()}
                  if path.is_dir() else {target})
        assert wanted <= sdist_names, f"README links {target}: missing {wanted - sdist_names}"
    for needed in ("jobs/demo.py", "disque.conf", "docs/DEPLOY.md", "docker/Dockerfile",
                   "deploy/kubernetes/statefulset.yaml", "deploy/systemd/disque.service",
                   "tests/conftest.py", ".ci/run", "setup.py", "pyproject.toml"):
        assert needed in sdist_names, needed
    assert not [n for n in sdist_names if n.endswith((".so", ".pyc")) or "__pycache__" in n]


def test_the_wheel_carries_the_packages_and_the_commands(tmp_path: Path) -> None:
    path = _build("wheel", tmp_path)
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    assert {"disque/server.py", "disque/drain.py", "spark_connector/__init__.py",
            "pyspark_disque.py"} <= names
    for script in ("disque-server = disque.server:main", "disque = disque.cli:main",
                   "disque-check-aof = disque.aof.check:main"):
        assert script in entry_points
    # Not a top-level 'jobs' package in site-packages: the README says where
    # the examples are for a wheel install (the sdist, the repository).
    assert not [n for n in names if n.startswith(("jobs/", "tests/", "docs/"))]
    assert "Installed from a wheel" in (ROOT / "README.md").read_text()
