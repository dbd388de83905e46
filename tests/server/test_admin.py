"""Server administration against real processes: start-up, config, auth,
clients, INFO, identity persistence and shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.process import DisqueProcess, raw_command, wait_for


def test_info_sections(server: DisqueProcess) -> None:
    r = server.client()
    text = raw_command(server.port, "INFO").decode()
    sections = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    assert sections == ["Server", "Clients", "Memory", "Jobs", "Queues", "Persistence", "Stats",
                        "Cpu"]
    info = r.info()
    for field in ("disque_version", "tcp_port", "process_id", "uptime_in_seconds",
                  "connected_clients", "blocked_clients", "used_memory", "registered_jobs",
                  "registered_queues", "aof_enabled", "aof_state", "total_commands_processed",
                  "cluster_reachable_nodes"):
        assert field in info, field
    assert raw_command(server.port, "INFO", "jobs") == b"# Jobs\r\nregistered_jobs:0\r\n"
    assert raw_command(server.port, "INFO", "JOBS") == b"# Jobs\r\nregistered_jobs:0\r\n"
    assert raw_command(server.port, "INFO", "nosuchsection") == b""


def test_stock_redis_py_resp3_works(server: DisqueProcess) -> None:
    """redis-py 8 sends HELLO 3 on connect; the node negotiates RESP3."""
    stock = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        assert stock.ping()
        job_id = stock.execute_command("ADDJOB", "q", "x", 0)
        shown = stock.execute_command("SHOW", job_id)
        assert isinstance(shown, dict) and shown[b"body"] == b"x"
        assert stock.execute_command("SHOW", "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0001") is None
        assert stock.execute_command("GETJOB", "NOHANG", "FROM", "none") is None
        assert stock.execute_command("GETJOB", "FROM", "q") == [[b"q", job_id, b"x"]]
    finally:
        stock.close()


def test_hello_negotiation_and_disque_hello(r: redis.Redis) -> None:
    reply = r.execute_command("HELLO", 2)
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    assert fields[b"proto"] == 2 and fields[b"server"] == b"disque"
    with pytest.raises(redis.ResponseError, match=r"^NOPROTO"):
        r.execute_command("HELLO", 4)
    version, node_id, *nodes = r.execute_command("HELLO")
    assert version == 1 and len(node_id) == 40
    assert nodes == [[node_id, b"127.0.0.1", str(r.connection_pool.connection_kwargs["port"])
                      .encode(), b"1"]]


def test_config_file_and_rewrite_keep_comments(server_factory, tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("# my settings\nloglevel verbose\n\n# memory\nmaxmemory 100mb\n")
    node = server_factory(config_file=conf)
    r = node.client()
    assert r.execute_command("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"100mb"]
    assert r.execute_command("CONFIG", "GET", "loglevel") == [b"loglevel", b"verbose"]
    assert r.execute_command("CONFIG", "SET", "maxmemory", "200mb") == b"OK"
    assert r.execute_command("CONFIG", "SET", "hz", "20") == b"OK"
    assert r.execute_command("CONFIG", "REWRITE") == b"OK"
    text = conf.read_text()
    assert "# my settings" in text and "# memory" in text
    assert "maxmemory 200mb" in text and "hz 20" in text and "maxmemory 100mb" not in text
    # The command-line --port/--dir given by the test harness are written too,
    # and the file still loads.
    node.restart()
    r = node.client()
    assert r.execute_command("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"200mb"]


def test_config_get_set_errors(r: redis.Redis) -> None:
    pairs = r.execute_command("CONFIG", "GET", "append*")
    assert dict(zip(pairs[::2], pairs[1::2], strict=True)) == {
        b"appendonly": b"no", b"appendfilename": b"appendonly.aof", b"appendfsync": b"everysec"}
    assert r.execute_command("CONFIG", "GET", "nosuch") == []
    with pytest.raises(redis.ResponseError, match="Unsupported CONFIG parameter: port"):
        r.execute_command("CONFIG", "SET", "port", "1234")
    with pytest.raises(redis.ResponseError, match="Invalid argument 'lots' for CONFIG SET"):
        r.execute_command("CONFIG", "SET", "maxmemory", "lots")
    with pytest.raises(redis.ResponseError, match="Invalid argument '-1'"):
        r.execute_command("CONFIG", "SET", "maxmemory", "-1")
    with pytest.raises(redis.ResponseError, match="running without a config file"):
        r.execute_command("CONFIG", "REWRITE")


def test_bad_config_file_refuses_to_start(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("port 7711\nmaxmemory lots\n")
    result = subprocess.run([sys.executable, "-m", "disque.server", str(conf)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "FATAL CONFIG FILE ERROR" in result.stderr and "maxmemory" in result.stderr
    result = subprocess.run([sys.executable, "-m", "disque.server", "--nosuch", "1"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "nosuch" in result.stderr


def test_requirepass(server_factory) -> None:
    node = server_factory("--requirepass", "s3cret")
    anonymous = node.client()
    with pytest.raises(redis.AuthenticationError):
        anonymous.execute_command("ADDJOB", "q", "x", 0)
    with pytest.raises(redis.AuthenticationError):
        anonymous.execute_command("AUTH", "wrong")
    assert raw_command(node.port, "PING") == b"PONG"  # health checks still work
    assert node.client(password="s3cret").execute_command("ADDJOB", "q", "x", 0)
    # Stock redis-py: HELLO 3 AUTH default <password>.
    stock = redis.Redis(host="127.0.0.1", port=node.port, password="s3cret")
    try:
        assert stock.execute_command("QLEN", "q") == 1
    finally:
        stock.close()


def test_client_commands(server: DisqueProcess) -> None:
    r = server.client()
    other = server.client()
    assert other.execute_command("CLIENT", "SETNAME", "worker-1") == b"OK"
    assert other.execute_command("CLIENT", "GETNAME") == b"worker-1"
    other_id = other.execute_command("CLIENT", "ID")
    listing = r.execute_command("CLIENT", "LIST").decode()
    assert "name=worker-1" in listing and f"id={other_id} " in listing
    with pytest.raises(redis.ResponseError, match="cannot contain spaces"):
        r.execute_command("CLIENT", "SETNAME", "bad name")
    assert r.execute_command("CLIENT", "KILL", "ID", other_id) == 1
    wait_for(lambda: "name=worker-1" not in r.execute_command("CLIENT", "LIST").decode(), 5,
             message="client gone")
    with pytest.raises(redis.ResponseError, match="No such client"):
        r.execute_command("CLIENT", "KILL", "10.0.0.1:1")


def test_command_time_debug(server: DisqueProcess) -> None:
    r = server.client()
    names = {entry[0] for entry in raw_command(server.port, "COMMAND")}
    assert {b"addjob", b"getjob", b"ackjob", b"jscan", b"hello"} <= names
    assert raw_command(server.port, "COMMAND", "COUNT") == len(names)
    seconds, micros = r.execute_command("TIME")
    assert int(seconds) > 1_600_000_000 and 0 <= int(micros) < 1_000_000
    r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("DEBUG", "FLUSHALL") == b"OK"
    assert r.info("jobs")["registered_jobs"] == 0 and r.info("queues")["registered_queues"] == 0


def test_cluster_commands_on_one_node(r: redis.Redis, unused_port: int) -> None:
    node_id = r.execute_command("CLUSTER", "MYID")
    nodes = r.execute_command("CLUSTER", "NODES").decode().strip().split("\n")
    assert len(nodes) == 1
    fields = nodes[0].split()
    assert fields[0] == node_id.decode() and fields[2] == "myself" and fields[5] == "connected"
    info = r.execute_command("CLUSTER", "INFO").decode()
    assert "cluster_known_nodes:1" in info
    with pytest.raises(redis.ResponseError, match="Invalid node address"):
        r.execute_command("CLUSTER", "MEET", "not-an-ip", "7711")
    # Nobody answers there: a handshake node waits in the table until it times out.
    assert r.execute_command("CLUSTER", "MEET", "127.0.0.1", str(unused_port)) == b"OK"
    nodes = r.execute_command("CLUSTER", "NODES").decode().strip().split("\n")
    assert any(f" 127.0.0.1:{unused_port} handshake " in line for line in nodes), nodes
    with pytest.raises(redis.ResponseError, match="can't forget myself"):
        r.execute_command("CLUSTER", "FORGET", node_id)
    with pytest.raises(redis.ResponseError, match="Unknown node"):
        r.execute_command("CLUSTER", "FORGET", "f" * 40)
    r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("CLUSTER", "RESET", "HARD") == b"OK"
    assert r.execute_command("CLUSTER", "MYID") != node_id
    assert r.info("jobs")["registered_jobs"] == 0
    new_id = r.execute_command("ADDJOB", "q", "x", 0)
    assert new_id[2:10] == r.execute_command("CLUSTER", "MYID")[:8]


def test_node_id_survives_restart_and_sigkill(server: DisqueProcess) -> None:
    node_id = server.client().execute_command("CLUSTER", "MYID")
    server.restart()
    assert server.client().execute_command("CLUSTER", "MYID") == node_id
    server.kill()
    server.start(port=server.port)
    assert server.client().execute_command("CLUSTER", "MYID") == node_id
    assert (server.workdir / "nodes.conf").read_text().split()[0] == node_id.decode()


def test_shutdown_command_and_signals(server_factory) -> None:
    node = server_factory()
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(b"SHUTDOWN\r\n")
        sock.settimeout(5)
        assert sock.recv(100) == b""  # no reply: the connection just closes
    node.proc.wait(10)
    assert node.proc.returncode == 0
    assert "bye bye" in node.log_text()
    for sig in (signal.SIGTERM, signal.SIGINT):
        other = server_factory(name=f"sig{int(sig)}")
        os.kill(other.pid, sig)
        assert other.proc.wait(10) == 0
        assert "bye bye" in other.log_text()


def test_quit_and_inline_ping(server: DisqueProcess) -> None:
    data = b""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"PING\r\nQUIT\r\n")
        sock.settimeout(5)
        while chunk := sock.recv(100):
            data += chunk
    assert data == b"+PONG\r\n+OK\r\n"


def test_default_start_serves_127_0_0_1_7711(tmp_path: Path) -> None:
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", 7711))
    except OSError:
        pytest.skip("port 7711 is in use on this machine; the default port cannot be tested")
    finally:
        probe.close()
    proc = subprocess.Popen(["disque-server"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=7711, protocol=2)
        wait_for(lambda: _pings(client), 15, message="default server")
        assert client.info()["tcp_port"] == 7711
        client.close()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    assert (tmp_path / "nodes.conf").exists()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
