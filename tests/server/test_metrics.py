"""The Prometheus endpoint (metrics-port, an extension): a real node, scraped
over HTTP and parsed with prometheus-client's own parser."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.support.metrics import scrape, value
from tests.support.process import DisqueProcess, free_port, wait_for


@pytest.fixture
def node(server_factory) -> DisqueProcess:
    port = free_port()
    node = server_factory("--metrics-port", str(port))
    node.metrics_port = port  # type: ignore[attr-defined]
    return node


def test_queue_and_job_figures_follow_addjob_getjob_ackjob(node) -> None:
    port = node.metrics_port
    client = node.client()
    before = scrape(port)
    assert value(before, "disque_queue_length", queue="orders") is None
    assert value(before, "disque_jobs") == 0
    ids = [client.execute_command("ADDJOB", "orders", f"job{i}", 0) for i in range(3)]
    client.execute_command("ADDJOB", "other", "x", 0)
    after_add = scrape(port)
    assert value(after_add, "disque_queue_length", queue="orders") == 3
    assert value(after_add, "disque_queue_enqueued_total", queue="orders") == 3
    assert value(after_add, "disque_queue_length", queue="other") == 1
    assert value(after_add, "disque_jobs") == 4
    assert value(after_add, "disque_jobs_enqueued_total") == 4
    assert value(after_add, "disque_jobs_delivered_total") == 0
    assert value(after_add, "disque_jobs_added_total") == 4
    got = client.execute_command("GETJOB", "COUNT", 2, "FROM", "orders")
    assert len(got) == 2
    after_get = scrape(port)
    assert value(after_get, "disque_queue_length", queue="orders") == 1
    assert value(after_get, "disque_queue_dequeued_total", queue="orders") == 2
    assert value(after_get, "disque_jobs_delivered_total") == 2
    assert value(after_get, "disque_commands_processed_total") > value(
        after_add, "disque_commands_processed_total")
    assert client.execute_command("ACKJOB", *[job[1] for job in got]) == 2
    after_ack = scrape(port)
    assert value(after_ack, "disque_jobs") == 2
    assert value(after_ack, "disque_jobs_acked_total") == 2
    stats = client.info("stats")
    assert (stats["added_jobs"], stats["delivered_jobs"], stats["acked_jobs"]) == (4, 2, 2)
    assert set(ids) >= {job[1] for job in got}
    # Replication latency: nothing replicated on a lone node.
    assert value(after_get, "disque_replication_latency_seconds_count") == 0
    # The process collector is there too.
    assert value(after_get, "process_resident_memory_bytes") > 0


def test_queue_names_that_are_not_utf8_are_labels_still(node) -> None:
    client = node.client()
    client.execute_command("ADDJOB", b"q\xff\"\n", "x", 0)
    assert value(scrape(node.metrics_port), "disque_queue_length", queue='q\\xff"\n') == 1


def test_queued_jobs_per_priority(node) -> None:
    client = node.client()
    client.execute_command("ADDJOB", "pq", "plain", 0)
    for priority in (3, 3, 20):
        client.execute_command("ADDJOB", "pq", "x", 0, "PRIORITY", priority)
    samples = scrape(node.metrics_port)
    assert value(samples, "disque_queue_priority_length", queue="pq", priority="3") == 2
    assert value(samples, "disque_queue_priority_length", queue="pq", priority="20") == 1
    assert value(samples, "disque_queue_priority_length", queue="pq", priority="0") is None
    assert value(samples, "disque_queue_length", queue="pq") == 4
    client.execute_command("GETJOB", "FROM", "pq")  # the priority-20 job
    samples = scrape(node.metrics_port)
    assert value(samples, "disque_queue_priority_length", queue="pq", priority="20") is None


def test_rate_limits(node) -> None:
    client = node.client()
    assert value(scrape(node.metrics_port), "disque_queue_rate_limit_jobs", queue="api") is None
    client.execute_command("QLIMIT", "api", 2, 1500)
    for i in range(3):
        client.execute_command("ADDJOB", "api", f"j{i}", 0)
    client.execute_command("GETJOB", "NOHANG", "COUNT", 3, "FROM", "api")  # 2 of 3: held back
    samples = scrape(node.metrics_port)
    assert value(samples, "disque_queue_rate_limit_jobs", queue="api") == 2
    assert value(samples, "disque_queue_rate_limit_period_seconds", queue="api") == 1.5
    assert value(samples, "disque_queue_rate_limited_total", queue="api") == 1
    client.execute_command("QLIMIT", "api", "OFF")
    assert value(scrape(node.metrics_port), "disque_queue_rate_limit_jobs", queue="api") is None


def test_a_blocked_getjob_counts_as_a_blocked_client(node) -> None:
    blocked = socket.create_connection(("127.0.0.1", node.port))
    try:
        blocked.sendall(b"*4\r\n$6\r\nGETJOB\r\n$4\r\nFROM\r\n$1\r\nw\r\n$1\r\nz\r\n")
        wait_for(lambda: value(scrape(node.metrics_port), "disque_queue_blocked_clients",
                               queue="w") == 1, message="the blocked client to show")
        assert value(scrape(node.metrics_port), "disque_blocked_clients") == 1
    finally:
        blocked.close()


def test_aof_state(server_factory) -> None:
    port = free_port()
    node = server_factory("--metrics-port", str(port), "--appendonly", "yes")
    client = node.client()
    first = scrape(port)
    assert value(first, "disque_aof_enabled") == 1
    assert value(first, "disque_aof_last_write_ok") == 1
    client.execute_command("ADDJOB", "q", "x" * 1000, 0)
    assert value(scrape(port), "disque_aof_size_bytes") > 1000
    client.execute_command("BGREWRITEAOF")
    wait_for(lambda: value(scrape(port), "disque_aof_rewrites_total") == 1,
             message="the rewrite to be counted")


def test_off_by_default(server) -> None:
    client = server.client()
    assert client.execute_command("CONFIG", "GET", "metrics-port") == [b"metrics-port", b"0"]
    assert "metrics" not in server.log_text().lower()


def http(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
    (b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n", b"404"),
    (b"GET /metrics\r\n\r\n", b"400"),
    (b"\x16\x03\x01\x00garbage\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"a" * 10_000, b"431"),
    (b"HEAD /metrics HTTP/1.1\r\n\r\n", b"200"),
    (b"GET /metrics?name[]=x HTTP/1.0\r\n\r\n", b"200"),
])
def test_bad_requests_get_http_errors(node, request_bytes: bytes, status: bytes) -> None:
    reply = http(node.metrics_port, request_bytes)
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:100]
    if request_bytes.startswith(b"HEAD"):
        assert reply.endswith(b"\r\n\r\n")  # headers only
    assert node.client().ping()


def test_a_silent_scraper_does_not_block_the_others(node) -> None:
    with socket.create_connection(("127.0.0.1", node.metrics_port)) as silent:
        silent.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of its headers
        assert value(scrape(node.metrics_port), "disque_jobs") == 0
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/", timeout=10)
    assert err.value.code == 404
    err.value.close()


@pytest.mark.parametrize(("args", "expected"), [
    (("--metrics-port", "70000"), "argument must be between 0 and 65535"),
    (("--metrics-port", "-1"), "argument must be between 0 and 65535"),
    (("--metrics-port", "http"), "argument must be an integer"),
])
def test_bad_directive_values_are_fatal_config_errors(tmp_path, args, expected) -> None:
    result = subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                             str(tmp_path), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "FATAL CONFIG FILE ERROR" in result.stderr and expected in result.stderr


def test_a_bind_address_that_is_not_one_stops_the_node(tmp_path) -> None:
    result = subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                             str(tmp_path), "--metrics-port", "9000", "--metrics-bind",
                             "no-such-host.invalid"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "Could not create the metrics TCP listening socket no-such-host.invalid:9000" in (
        result.stdout + result.stderr)


def test_a_taken_metrics_port_stops_the_node_with_a_clear_error(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                                 str(tmp_path), "--metrics-port", str(port)],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"Could not create the metrics TCP listening socket 127.0.0.1:{port}" in (
        result.stdout + result.stderr)


def test_config_set_cannot_change_it(node) -> None:
    client = node.client()
    for name in ("metrics-port", "metrics-bind"):
        with pytest.raises(Exception, match="Unsupported CONFIG parameter"):
            client.execute_command("CONFIG", "SET", name, "9999")
