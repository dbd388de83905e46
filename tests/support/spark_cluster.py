"""A real Spark standalone cluster for tests: a master and workers started from
the ``SPARK_HOME`` the driver's pyspark uses (the pip install's unless
``SPARK_HOME`` is set), each its own JVM, on loopback.

Every port is the kernel's choice (``--port 0``, ``--webui-port 0``) and read
back from the logs. Each worker has its own work directory. A worker made
with ``hide=[...]`` runs in its own mount namespace (``unshare -m``) with an
empty tmpfs over each of those directories: its executors cannot see the
driver's files, nor the checkout, so the connector must reach them the way
it reaches a real cluster (``spark.submit.pyFiles``, staging on shared
storage). The interpreter's own prefix and Spark's home stay (:func:`kept`):
a venv inside the checkout, as the README sets one up, is still there.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from spark_connector.pyspark_zips import spark_home
from tests.support.process import wait_for

__all__ = ["SparkStandalone", "Worker", "can_hide", "driver_conf", "hiding", "kept", "kill_group",
           "spark_home", "standalone_cluster", "submit"]

MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
WORKER_REGISTERED = re.compile(r"Successfully registered with master")


def can_hide() -> bool:
    """Can this process give a child its own mount namespace (root, unshare)?"""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def kept(hide: Sequence[Path]) -> list[Path]:
    """What hiding ``hide`` must leave in place: the interpreter's prefix (a
    venv) and Spark's home, when they lie under a hidden directory.

    The README sets up a venv inside the checkout (``.venv``), with pyspark
    in it; hiding the checkout from a worker must not take away the Python
    it runs (``spark.pyspark.python``) nor ``spark-class``. The project
    stays hidden: the venv's editable install points into the checkout.
    """
    hidden = [Path(os.path.abspath(p)) for p in hide]
    out: list[Path] = []
    for path in (Path(os.path.abspath(sys.prefix)), spark_home()):
        if any(path.is_relative_to(h) for h in hidden) and not any(
                path.is_relative_to(k) for k in out):
            out.append(path)
    return out


def hiding(hide: Sequence[Path], stash: Path, argv: Sequence[str], *, size: str = "64m",
           before: str = "") -> list[str]:
    """``argv`` run in its own mount namespace with an empty tmpfs over each of
    ``hide``, except what :func:`kept` keeps, bound back in place (through
    ``stash``, a directory outside the hidden ones). ``before``: shell
    commands to run once the mounts are made."""
    keep = kept(hide)
    steps = []
    for i, path in enumerate(keep):  # reachable while its parent is hidden
        steps += [f"mkdir -p {shlex.quote(str(stash / str(i)))}",
                  f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(stash / str(i)))}"]
    steps += [f"mount -t tmpfs -o size={size} disque-test-hidden {shlex.quote(str(p))}"
              for p in hide]
    for i, path in enumerate(keep):
        steps += [f"mkdir -p {shlex.quote(str(path))}",
                  f"mount --bind {shlex.quote(str(stash / str(i)))} {shlex.quote(str(path))}"]
    if before:
        steps.append(before)
    script = " && ".join([*steps, f"exec {shlex.join(argv)}"])
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1")
    return env


class Worker:
    def __init__(self, name: str, proc: subprocess.Popen, log: Path, workdir: Path,
                 hidden: Sequence[Path]) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.workdir = workdir
        self.hidden = tuple(hidden)

    def executor_pids(self) -> list[int]:
        """The executor JVMs this worker runs now: its child processes.

        Each thread lists its own children (``/proc/PID/task/TID/children``),
        and the worker starts executors from a thread of their own.
        """
        pids: list[int] = []
        for task in Path(f"/proc/{self.proc.pid}/task").glob("*"):
            try:
                pids += [int(pid) for pid in (task / "children").read_text().split()]
            except OSError:  # the thread ended meanwhile
                continue
        return pids


class SparkStandalone:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.master: subprocess.Popen | None = None
        self.master_log = root / "master.log"
        self.url = ""
        self.workers: list[Worker] = []

    def _spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.root, start_new_session=True)

    def start_master(self) -> str:
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.master = self._spawn([spark_class, "org.apache.spark.deploy.master.Master",
                                   "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                                  self.master_log, base_env())

        def started() -> str | None:
            found = MASTER_URL.search(self.master_log.read_text(errors="replace"))
            if found is None and self.master is not None and self.master.poll() is not None:
                raise RuntimeError(f"the Spark master exited: {self.tail(self.master_log)}")
            return found.group(1) if found else None

        self.url = wait_for(started, timeout=120, interval=0.2,
                            message=lambda: f"the Spark master: {self.tail(self.master_log)}")
        return self.url

    def add_worker(self, name: str, *, cores: int = 1, memory: str = "1500m",
                   hide: Sequence[Path] = ()) -> Worker:
        workdir = self.root / name
        log = self.root / f"{name}.log"
        argv = [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                "--cores", str(cores), "--memory", memory, "--work-dir", str(workdir), self.url]
        if hide:
            # Private mounts: the empty tmpfs over each hidden directory is
            # seen by this worker and its executors only. Its work directory
            # is made after, so it may lie under a hidden one.
            argv = hiding(hide, self.root / f"{name}-kept", argv,
                          before=f"mkdir -p {shlex.quote(str(workdir))}")
        else:
            workdir.mkdir(parents=True, exist_ok=True)
        worker = Worker(name, self._spawn(argv, log, base_env()), log, workdir, hide)
        self.workers.append(worker)

        def registered() -> bool:
            if worker.proc.poll() is not None:
                raise RuntimeError(f"Spark worker {name} exited: {self.tail(log)}")
            return bool(WORKER_REGISTERED.search(log.read_text(errors="replace")))

        wait_for(registered, timeout=120, interval=0.2,
                 message=lambda: f"Spark worker {name} to register: {self.tail(log)}")
        return worker

    @staticmethod
    def tail(path: Path, size: int = 3000) -> str:
        try:
            return path.read_text(errors="replace")[-size:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Workers first (each takes its executors with it), then the master."""
        for proc in [w.proc for w in self.workers] + ([self.master] if self.master else []):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            # Executors the worker could not stop are in its process group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@contextmanager
def standalone_cluster(root: Path, hide: Sequence[Path] = ()) -> Iterator[SparkStandalone]:
    """A master and two workers of one core each; the second hides ``hide``."""
    cluster = SparkStandalone(root)
    try:
        cluster.start_master()
        cluster.add_worker("worker-a")
        cluster.add_worker("worker-b", hide=hide)
        yield cluster
    finally:
        cluster.stop()


def driver_conf(cluster: SparkStandalone) -> dict[str, str]:
    """What an application's driver sets to run on ``cluster`` over loopback."""
    return {
        "spark.master": cluster.url,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.executor.memory": "700m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.pyspark.python": sys.executable,
        "spark.sql.shuffle.partitions": "2",
    }


def submit(cluster: SparkStandalone, app: Path, args: Sequence[str], *, cwd: Path, log: Path,
           py_files: Path | None = None, env: dict[str, str] | None = None,
           conf: dict[str, str] | None = None) -> subprocess.Popen:
    """``spark-submit`` ``app`` to ``cluster`` in client mode, in its own process group.

    ``py_files`` is shipped as the docs say: ``--py-files`` puts it in each
    executor's working directory, ``spark.executorEnv.PYTHONPATH`` on the
    path of the Python workers Spark starts there (whose working directory
    it is). ``env`` reaches the driver and, through ``spark.executorEnv``,
    the executors.
    """
    settings = {**driver_conf(cluster), **(conf or {})}
    for name, value in (env or {}).items():
        settings[f"spark.executorEnv.{name}"] = value
    argv = [str(spark_home() / "bin" / "spark-submit")]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    if py_files is not None:
        argv += ["--py-files", str(py_files),
                 "--conf", f"spark.executorEnv.PYTHONPATH={py_files.name}"]
    argv += [str(app), *args]
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**base_env(), "PYSPARK_PYTHON": sys.executable, **(env or {})})


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with ``start_new_session`` and all its children."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
