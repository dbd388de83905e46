"""Where the Spark benchmarks run: ``local[2]`` or a standalone cluster; staging local or on S3.

``--standalone`` starts a Spark standalone master and two workers of one core
each from the pip pyspark install (tests/support/spark_cluster.py), so the
driver, each executor and each Python worker are separate processes talking
over loopback, as on a real cluster. ``--staging s3`` starts ``moto_server``
(a local S3-compatible server, tests/support/s3.py) and puts the source's
``stagingPath`` on it, its credentials and endpoint passed to the executors
through ``spark.executorEnv``. moto is a Python server sharing the machine's
cores: S3 figures measured against it are a floor, not what AWS S3 gives.

Spark runs from a ``SPARK_HOME`` without PySpark's zips by default, as the
Spark image does (docker/Dockerfile.spark, spark_connector/pyspark_zips.py):
a temporary directory of links to the pip install's files, ``python/lib``
left out, so that each Python process Spark starts loads the installed
bytecode instead of compiling the zip's modules. ``--pyspark-zips keep``
measures the pip install as it is.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Placement", "add_arguments", "placement", "pyspark_zips", "spark_home_without_zips",
           "zips_line"]


@dataclass
class Placement:
    master: str
    conf: dict[str, str] = field(default_factory=dict)
    #: ``stagingPath`` prefix (a URI) or None for a local directory per run.
    staging_prefix: str | None = None

    def staging(self, root: Path, name: str) -> str:
        if self.staging_prefix is None:
            return str(root / f"staging-{name}")
        return f"{self.staging_prefix}/staging-{name}-{uuid.uuid4().hex[:8]}"


def add_arguments(parser: argparse.ArgumentParser, staging: bool = True) -> None:
    parser.add_argument("--standalone", action="store_true",
                        help="run on a Spark standalone master + 2 workers started here "
                             "(instead of --master)")
    if staging:
        parser.add_argument("--staging", choices=("local", "s3"), default="local",
                            help="stagingPath on a local directory or on a local moto_server "
                                 "(S3)")
    parser.add_argument("--pyspark-zips", choices=("skip", "keep"), default="skip",
                        help="skip: Spark runs from a SPARK_HOME without PySpark's zips, as "
                             "the Spark image does; keep: the pip install as it is "
                             "(default: %(default)s)")


def spark_home_without_zips(root: Path, real: Path) -> Path:
    """A ``SPARK_HOME`` under ``root``: links to ``real``'s files, but no python/lib."""
    home = root / "spark-home"
    (home / "python").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    for entry in (real / "python").iterdir():
        if entry.name != "lib":
            (home / "python" / entry.name).symlink_to(entry)
    return home


def pyspark_zips() -> list[str]:
    """The zips Spark would put on its Python processes' path now."""
    from spark_connector.pyspark_zips import spark_home, zips

    return [str(p) for p in zips(spark_home())]


def zips_line(found: list[str]) -> str:
    """What a report says about :func:`pyspark_zips`."""
    return ("PySpark's zips on the path of Spark's Python processes: "
            + (", ".join(found) or "none (they load the installed bytecode)"))


@contextmanager
def _without_zips() -> Iterator[None]:
    """``SPARK_HOME`` set to a copy of links without the zips, for this context.

    Only for a pip install of PySpark (as ``pyspark_zips --remove`` would
    allow): a Spark whose zips are its own copy of PySpark runs as it is.
    """
    from spark_connector.pyspark_zips import refusal, spark_home, zips

    real = spark_home().resolve()
    why = refusal(real, zips(real))
    if why is not None:
        print(f"--pyspark-zips skip: Spark runs with its zips, {why}", file=sys.stderr)
        yield
        return
    before = os.environ.get("SPARK_HOME")
    with tempfile.TemporaryDirectory(prefix="spark-home-") as root:
        os.environ["SPARK_HOME"] = str(spark_home_without_zips(Path(root), real))
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("SPARK_HOME", None)
            else:
                os.environ["SPARK_HOME"] = before


@contextmanager
def placement(args: argparse.Namespace) -> Iterator[Placement]:
    """Start what ``--standalone`` / ``--staging s3`` ask for; stop it after."""
    with ExitStack() as stack:
        where = Placement(master=args.master)
        if getattr(args, "pyspark_zips", "keep") == "skip":
            stack.enter_context(_without_zips())
        if args.standalone:
            from tests.support.spark_cluster import driver_conf, standalone_cluster

            # Loopback only, the driver too (else Spark binds it to the host's address).
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spark-sa-")))
            cluster = stack.enter_context(standalone_cluster(root))
            where.conf = driver_conf(cluster)
            where.master = cluster.url
            # Executors of 1 core each, and the driver's memory the caller asks.
            where.conf.pop("spark.master")
            where.conf["spark.executor.memory"] = "1g"
        if getattr(args, "staging", "local") == "s3":
            from tests.support.s3 import moto_server

            log = Path(tempfile.gettempdir()) / "spark_bench_moto.log"
            server = stack.enter_context(moto_server(log))
            bucket = server.bucket(f"bench-{uuid.uuid4().hex[:8]}")
            os.environ.update(server.env)
            for name, value in server.env.items():
                where.conf[f"spark.executorEnv.{name}"] = value
            where.staging_prefix = f"s3://{bucket}"
        yield where
