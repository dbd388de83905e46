"""``python -m spark_connector.pyspark_zips``: listing and removing PySpark's zips.

On a copy of a Spark home's layout with real zip files (the installed
PySpark is not touched); the image built without them is checked in
tests/containers/test_images.py.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from spark_connector.pyspark_zips import main, only_in_zips, spark_home, zips


def fake_home(root: Path) -> tuple[Path, list[Path]]:
    lib = root / "python" / "lib"
    lib.mkdir(parents=True)
    made = []
    for name, package in [("pyspark.zip", "pyspark"), ("py4j-0.10.9.9-src.zip", "py4j")]:
        path = lib / name
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{package}/__init__.py", "")
        made.append(path)
    (lib / "README").write_text("not a zip")
    return root, made


def test_zips_lists_the_zips_of_python_lib(tmp_path: Path) -> None:
    home, made = fake_home(tmp_path)
    assert zips(home) == sorted(made)
    assert zips(tmp_path / "elsewhere") == []


def test_the_pip_install_is_found_without_spark_home(monkeypatch) -> None:
    import pyspark

    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert spark_home() == Path(pyspark.__file__).parent
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert spark_home() == Path("/opt/spark")


def test_packages_only_in_the_zips_are_named(tmp_path: Path) -> None:
    _, made = fake_home(tmp_path)
    # Here pyspark and py4j are installed as packages too (site-packages).
    assert only_in_zips(made) == []
    # A path that has nothing but the zips: both would be lost.
    assert only_in_zips(made, [str(p) for p in made]) == ["pyspark", "py4j"]
    assert only_in_zips(made, []) == ["pyspark", "py4j"]


def test_listing_changes_nothing(tmp_path: Path, capsys) -> None:
    home, made = fake_home(tmp_path)
    assert main(["--spark-home", str(home)]) == 0
    out = capsys.readouterr().out
    assert all(str(p) in out for p in made)
    assert "--remove deletes the zips" in out
    assert all(p.exists() for p in made)


def test_remove_deletes_them_and_says_so(tmp_path: Path, capsys) -> None:
    home, made = fake_home(tmp_path)
    assert main(["--spark-home", str(home), "--remove"]) == 0
    assert not any(p.exists() for p in made)
    assert (home / "python" / "lib" / "README").exists()
    assert capsys.readouterr().out.count("removed ") == 2
    assert main(["--spark-home", str(home)]) == 0
    assert "no zips under python/lib" in capsys.readouterr().out


def test_remove_is_refused_where_the_zips_are_the_only_copy(tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    """A Spark distribution whose Python path is its zips: nothing is deleted."""
    home, made = fake_home(tmp_path)
    monkeypatch.setattr(sys, "path", [str(p) for p in made])
    assert main(["--spark-home", str(home), "--remove"]) == 1
    assert "refused: pyspark, py4j would no longer be importable" in capsys.readouterr().err
    assert all(p.exists() for p in made)
    assert main(["--spark-home", str(home)]) == 0
    assert "only in the zips: pyspark, py4j; keep them" in capsys.readouterr().out
