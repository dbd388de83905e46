"""``python -m spark_connector.pyspark_zips``: listing and removing PySpark's zips.

On a copy of a pip install's layout in a temporary site directory (a
``pyspark`` package that is also the Spark home, ``py4j`` beside it, real
zip files); the installed PySpark is not touched.  The image built without
the zips is checked in tests/containers/test_images.py.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from spark_connector.pyspark_zips import main, refusal, spark_home, zips

PY4J_ZIP = "py4j-0.10.9.9-src.zip"


def pip_install(site: Path) -> tuple[Path, list[Path]]:
    """``site/pyspark`` (the Spark home of a pip install) and ``site/py4j``."""
    home = site / "pyspark"
    lib = home / "python" / "lib"
    lib.mkdir(parents=True)
    (home / "__init__.py").write_text("")
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    made = []
    for name, package in [("pyspark.zip", "pyspark"), (PY4J_ZIP, "py4j")]:
        with zipfile.ZipFile(lib / name, "w") as archive:
            archive.writestr(f"{package}/__init__.py", "")
        made.append(lib / name)
    (lib / "README").write_text("not a zip")
    (lib / "other.zip").write_bytes(b"")  # not a zip Spark puts on the path
    return home, sorted(made)


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """A site directory that is the whole search path (cwd elsewhere)."""
    site = tmp_path / "site"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(site)])
    return site


def test_zips_lists_what_spark_puts_on_the_path(tmp_path: Path) -> None:
    home, made = pip_install(tmp_path / "site")
    assert zips(home) == made
    assert zips(tmp_path / "elsewhere") == []


def test_the_pip_install_is_found_without_spark_home(monkeypatch) -> None:
    import pyspark

    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert spark_home().resolve() == Path(pyspark.__file__).resolve().parent
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert spark_home() == Path("/opt/spark")


def test_only_a_pip_install_may_lose_its_zips(tmp_path: Path) -> None:
    home, made = pip_install(tmp_path / "site")
    site = str(tmp_path / "site")
    assert refusal(home, made, [site]) is None
    # Only in the zips: nothing else to import.
    only = refusal(home, made, [str(p) for p in made])
    assert only is not None and only.startswith("pyspark, py4j would no longer be importable")
    # A Spark distribution beside a pip install: its zips are its own PySpark.
    distribution = tmp_path / "spark-4.0.0-bin"
    (distribution / "python" / "lib").mkdir(parents=True)
    other = refusal(distribution, [], [site])
    assert other is not None and "is not the installed PySpark" in other
    # Stray folders named like the packages are not installs (namespace specs).
    (tmp_path / "stray" / "pyspark").mkdir(parents=True)
    (tmp_path / "stray" / "py4j").mkdir()
    assert refusal(home, made, [str(tmp_path / "stray")]) is not None


def test_listing_changes_nothing(site: Path, capsys) -> None:
    home, made = pip_install(site)
    assert main(["--spark-home", str(home)]) == 0
    out = capsys.readouterr().out
    assert all(str(p) in out for p in made) and "other.zip" not in out
    assert "--remove deletes the zips" in out
    assert all(p.exists() for p in made)


def test_remove_deletes_them_and_says_so(site: Path, capsys) -> None:
    home, made = pip_install(site)
    assert main(["--spark-home", str(home), "--remove"]) == 0
    assert not any(p.exists() for p in made)
    assert (home / "python" / "lib" / "README").exists()
    assert (home / "python" / "lib" / "other.zip").exists()
    assert capsys.readouterr().out.count("removed ") == 2
    assert main(["--spark-home", str(home)]) == 0
    assert "no zips under python/lib" in capsys.readouterr().out


def test_remove_is_refused_where_the_zips_are_the_only_copy(site: Path, monkeypatch,
                                                          capsys) -> None:
    """A Spark whose Python path is its zips: nothing is deleted."""
    home, made = pip_install(site)
    monkeypatch.setattr(sys, "path", [str(p) for p in made])
    assert main(["--spark-home", str(home), "--remove"]) == 1
    assert "refused: pyspark, py4j would no longer be importable" in capsys.readouterr().err
    assert all(p.exists() for p in made)
    assert main(["--spark-home", str(home)]) == 0
    assert "keep them: pyspark, py4j would no longer be importable" in capsys.readouterr().out
