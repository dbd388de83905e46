"""The example pipelines in jobs/, run against a real node with small inputs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from disque.client import Client, Job
from jobs import demo, produce_events, stream_aggregates, worker
from tests.support.process import wait_for

ROOT = Path(__file__).resolve().parents[2]


def registered(client: Client) -> int:
    return int(client.info("jobs")["jobs"]["registered_jobs"])


def test_producer_writes_one_json_job_per_event(spark, server, tmp_path: Path) -> None:
    dataset = produce_events.write_dataset(tmp_path / "data", 300, minutes=10)
    nodes = f"127.0.0.1:{server.port}"
    assert produce_events.produce(spark, dataset, nodes, "orders") == 300
    client = Client(nodes)
    assert client.qlen("orders") == 300
    (job,) = client.qpeek("orders", 1)
    event = json.loads(job.body)
    assert set(event) == {"order_id", "customer", "product", "quantity", "amount", "event_time"}
    assert client.show(job.id)["retry"] == 60


def expected_windows(count: int, minutes: int, window_minutes: int) -> Counter:
    """Orders per (window start, product), computed from the dataset directly."""
    table = produce_events.generate_events(count, minutes)
    out: Counter = Counter()
    size = timedelta(minutes=window_minutes)
    for product, when in zip(table.column("product").to_pylist(),
                             table.column("event_time").to_pylist(), strict=True):
        start = produce_events.EPOCH + ((when - produce_events.EPOCH) // size) * size
        out[(start, product)] += 1
    return out


def test_stream_aggregates_counts_every_order_once(spark, server, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    nodes = f"127.0.0.1:{server.port}"
    dataset = produce_events.write_dataset(tmp_path / "data", 800, minutes=30)
    produce_events.produce(spark, dataset, nodes, "orders")
    query = stream_aggregates.build_query(
        spark, nodes=nodes, queue="orders", output=tmp_path / "out",
        checkpoint=tmp_path / "checkpoint", staging=tmp_path / "staging",
        available_now=True, max_jobs_per_trigger=300)
    query.awaitTermination(300)
    assert query.exception() is None
    client = Client(nodes)
    assert client.qlen("orders") == 0 and registered(client) == 0  # all consumed and ACKed
    rows = pq.read_table(tmp_path / "out").to_pylist()
    expected = expected_windows(800, 30, 5)
    # Spark writes the windows as naive timestamp[ns]; to_pylist() gives
    # datetime objects, or pandas Timestamps when pandas is installed (the
    # spark extra installs it), which refuse astimezone() on naive values.
    got = {(_as_datetime(r["window_start"]).astimezone(produce_events.EPOCH.tzinfo),
            r["product"]): r["orders"] for r in rows}
    assert got, "closed windows must have been written"
    for key, orders in got.items():
        assert orders == expected[key], key
    # Every window that ended well before the last event time is closed.
    closed_starts = {start for start, _ in got}
    assert {produce_events.EPOCH + timedelta(minutes=m) for m in (0, 5, 10, 15)} <= closed_starts


def _as_datetime(value):
    return value.to_pydatetime() if hasattr(value, "to_pydatetime") else value


def order(amount: float) -> bytes:
    return json.dumps({"order_id": "o-1", "amount": amount}).encode()


def test_worker_acks_nacks_and_dead_letters(server) -> None:
    nodes = f"127.0.0.1:{server.port}"
    client = Client(nodes)
    good = client.add_jobs("orders", [order(10.0) for _ in range(5)])
    poison = client.add_jobs("orders", [order(-1.0), order(-2.0)])
    with Client(nodes) as consumer, Client(nodes) as heartbeats:
        stats = worker.run(consumer, heartbeats, "orders", worker.process_order,
                           max_attempts=2, idle_exit=1.0)
    assert (stats.acked, stats.nacked, stats.dead_lettered) == (5, 4, 2)
    assert client.qlen("orders") == 0
    dead = client.get_jobs("orders-dead", count=10, nohang=True)
    assert sorted(j.body for j in dead) == sorted([order(-1.0), order(-2.0)])
    assert all(client.show(i) is None for i in good + poison)  # originals acknowledged


def test_worker_with_server_dead_letters(server) -> None:
    """The node dead-letters (MAXDELIVERIES): the worker only NACKs, with a delay."""
    nodes = f"127.0.0.1:{server.port}"
    client = Client(nodes)
    good = client.add_jobs("orders", [order(10.0) for _ in range(3)], max_deliveries=2)
    poison = client.add_jobs("orders", [order(-1.0), order(-2.0)], max_deliveries=2, retry=5)
    with Client(nodes) as consumer, Client(nodes) as heartbeats:
        stats = worker.run(consumer, heartbeats, "orders", worker.process_order,
                           idle_exit=2.5, server_dead_letters=True, nack_delay=1)
    # Two deliveries each for the poison jobs, both NACKed; then moved by the node.
    assert (stats.acked, stats.nacked, stats.dead_lettered) == (3, 4, 0)
    assert client.qstat("orders")["dead-lettered"] == 2
    dead = client.get_jobs("orders:dead", count=10, nohang=True, with_counters=True)
    assert sorted(j.id for j in dead) == sorted(poison)  # the same jobs, moved
    assert {j.nacks for j in dead} == {2}
    assert all(client.show(i) is None for i in good)
    client.ack(*poison)


def test_worker_heartbeats_keep_a_slow_job_leased(server) -> None:
    nodes = f"127.0.0.1:{server.port}"
    client = Client(nodes)
    job_id = client.add_job("slow", order(1.0), retry=1)
    seen_states: list[str] = []

    def slow_handler(job: Job) -> None:
        # The "work" takes 2.5 RETRY periods; meanwhile the job must stay active.
        for _ in range(5):
            time.sleep(0.5)
            seen_states.append(client.show(job.id)["state"])

    with Client(nodes) as consumer, Client(nodes) as heartbeats:
        stats = worker.run(consumer, heartbeats, "slow", slow_handler, max_jobs=1)
    assert stats.acked == 1
    assert seen_states == ["active"] * 5
    assert client.show(job_id) is None


def session_processes(sid: int) -> list[int]:
    """PIDs still alive in session ``sid`` (the demo ran as its leader)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def demo_command(tmp_path: Path) -> list[str]:
    # The workdir is the demo's default name, under tmp_path, so that the
    # README's look at "demo-output/aggregates" runs as written from there.
    return [sys.executable, "-m", "jobs.demo", "--short", "--port", "0",
            "--workdir", str(tmp_path / "demo-output")]


def start_demo(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    log_path = tmp_path / "demo.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            demo_command(tmp_path),
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    return proc, log_path


def run_demo_on_a_terminal(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """(exit status, what the terminal showed, pid) of a demo run under a pty."""
    import pexpect

    command = [*demo_command(tmp_path), *args]
    child = pexpect.spawn(command[0], command[1:], cwd=str(ROOT), encoding="utf-8",
                          timeout=600, dimensions=(40, 120),
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                               "TERM": "xterm"})
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    return child.exitstatus, child.before, child.pid


def readme_tour_line(prefix: str) -> str:
    """A ``$ command`` line of the README's tour, as written."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("$ " + prefix):
            return line[2:].split("  #")[0].strip()
    raise AssertionError(f"no '$ {prefix}...' line in README.md")


def plain_text(terminal_output: str) -> str:
    """What a terminal showed, without its escape sequences, one line per line."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal_output).replace("\r", "\n")


@pytest.mark.slow
def test_demo_runs_end_to_end_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Output to a pipe (a log, CI); the terminal's progress bar is checked by
    the three-node run below, so the two runs cover both outputs."""
    proc, log_path = start_demo(tmp_path)
    try:
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    assert code == 0, text[-3000:]
    assert "produced:   2000 jobs" in text
    assert "consumed:   2000 jobs" in text
    assert "acked:      2000 jobs; 0 still queued, 0 on the node" in text
    assert "result:     OK" in text
    # While Spark starts it says so, instead of repeating "0/2000 consumed".
    assert "starting Spark" in text
    assert text.count(demo.FIRST_BATCH) == 1
    assert "] 0/2000 consumed" not in text
    wait_for(lambda: not session_processes(proc.pid), timeout=30,
             message=lambda: f"demo processes to exit: {session_processes(proc.pid)}")
    # The tour's next command, run as the README writes it, in the directory
    # that holds demo-output/ (it needs pandas, which the spark extra installs).
    look = subprocess.run(["bash", "-c", readme_tour_line("python3 -c")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert look.returncode == 0, look.stderr
    assert "window_start" in look.stdout and "revenue" in look.stdout


@pytest.mark.slow
def test_demo_ctrl_c_stops_everything(tmp_path: Path) -> None:
    proc, log_path = start_demo(tmp_path)
    try:
        wait_for(lambda: "2/3 produced" in log_path.read_text(), timeout=300, interval=0.2,
                 message=lambda: log_path.read_text()[-3000:])
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, log_path.read_text()[-3000:]
    assert "interrupted" in log_path.read_text()
    wait_for(lambda: not session_processes(proc.pid), timeout=30,
             message=lambda: f"demo processes to exit: {session_processes(proc.pid)}")


@pytest.mark.slow
def test_demo_on_a_three_node_cluster_shows_where_the_jobs_went(tmp_path: Path) -> None:
    """On a terminal (a pty), so the same run checks the progress bar."""
    code, shown, pid = run_demo_on_a_terminal(tmp_path, "--nodes", "3")
    text = plain_text(shown)
    assert code == 0, text[-3000:]
    assert "3 nodes up and joined in one cluster" in text
    assert "acked:      2000 jobs; 0 still queued, 0 on the nodes" in text
    assert "result:     OK" in text
    assert "starting Spark" in text
    assert demo.FIRST_BATCH_SHORT in text and "━" in text  # the progress bar
    assert "2000/2000 consumed, 2000 acked" in text  # the bar ends with the final ACK
    # One line per node: jobs the sink queued there / jobs it delivered.
    per_node = [(int(q), int(f)) for q, f in
                re.findall(r"^ {4}127\.0\.0\.1:\d+ +(\d+) / +(\d+)$", text, re.M)]
    assert len(per_node) == 3, text[-3000:]
    assert sum(q for q, _ in per_node) == 2000 and all(q > 0 for q, _ in per_node)
    assert sum(f for _, f in per_node) == 2000
    assert "stopped the nodes; nothing left running" in text
    wait_for(lambda: not session_processes(pid), timeout=30,
             message=lambda: f"demo processes to exit: {session_processes(pid)}")
