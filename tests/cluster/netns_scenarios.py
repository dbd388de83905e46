"""Scenarios that need a network namespace of their own (run by
test_discovery_dns.py and test_announce_nat.py as subprocesses):

* ``discovery``: nodes on 127.0.3.x, all on port 7711, find each other with
  ``cluster-discovery`` through a DNS stub (tests/support/dns_stub.py) the
  resolver is pointed at (/etc/resolv.conf bind-mounted in a private mount
  namespace): a scale-up, a scale-down (drained, then forgotten by all), a
  restart at a new address that stays silent longer than the forget time
  (as during a long AOF load: not forgotten), every node rescheduled at
  once at new addresses (the cluster reforms with the same IDs).
* ``nat``: nodes bound to 127.0.1.x, announcing 127.0.2.x with other client
  and bus ports; nft DNATs the announced addresses to the real ones and
  rejects every connection to a real address that was not translated, so
  the client, the Spark connectors and the peers can reach the nodes only
  by their announced addresses (with the cluster secret set: the announced
  address and the signature share the header); and a partition (nft drops
  between node 1 and the others) that leaves every node ready (/readyz).

``python -m tests.cluster.netns_scenarios discovery|nat [--spark]``: re-executes
itself under ``unshare -n -m`` (faults/netns.py); exit 0 passed, 1 failed
(the reason on stderr), 77 cannot run here (no root, no nft).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from faults import EXIT_SKIPPED, netns
from tests.support.dns_stub import DnsStub
from tests.support.process import DisqueProcess, wait_for

NAME = "disque-peers.test"
PORT = 7711
METRICS = 9711


class Node:
    """A node at ``ip``:7711 in ``workdir`` (kept across restarts)."""

    def __init__(self, workdir: Path, ip: str, *args: str) -> None:
        self.workdir = workdir
        self.args = args
        self.ip = ip
        self.proc: DisqueProcess | None = None
        self.id = ""

    def start(self, ip: str | None = None) -> Node:
        self.ip = ip or self.ip
        extra = ("--metrics-bind", self.ip) if "--metrics-port" in self.args else ()
        self.proc = DisqueProcess(self.workdir, "--bind", self.ip, *self.args, *extra)
        self.proc.start(port=PORT)
        self.id = self.client().execute_command("CLUSTER", "MYID").decode()
        return self

    def client(self, ip: str | None = None, port: int = PORT) -> redis.Redis:
        return redis.Redis(host=ip or self.ip, port=port, protocol=2, socket_timeout=10)

    def view(self) -> dict[str, tuple[str, set[str]]]:
        """CLUSTER NODES: node ID -> (address, flags)."""
        text = self.client().execute_command("CLUSTER", "NODES").decode()
        out = {}
        for line in text.splitlines():
            fields = line.split()
            out[fields[0]] = (fields[1], set(fields[2].split(",")) - {"myself", "noflags"})
        return out

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.stop(timeout=20)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()


def ready(ip: str) -> tuple[int, str]:
    """GET /readyz on the metrics port: (status, body)."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{METRICS}/readyz", timeout=5) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()
    except OSError:
        return 0, ""


def all_see(nodes: list[Node], expected: dict[str, str]) -> bool:
    """Every node's table is exactly ``expected`` (ID -> ip), nobody failing."""
    for node in nodes:
        view = node.view()
        if {nid: addr.rsplit(":", 1)[0] for nid, (addr, _f) in view.items()} != expected:
            return False
        if any(flags for _a, flags in view.values()):
            return False
    return True


def describe(nodes: list[Node]) -> str:
    lines = []
    for node in nodes:
        try:
            lines.append(f"{node.ip}: {node.view()}")
        except (redis.RedisError, OSError) as err:
            lines.append(f"{node.ip}: {err}")
    return "\n".join(lines)


def point_resolver_at_stub(work: Path) -> DnsStub:
    """The stub on 127.0.0.1:53, and the resolver (nodes included) using it."""
    resolv = work / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    nsswitch = work / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    for path, target in ((resolv, "/etc/resolv.conf"), (nsswitch, "/etc/nsswitch.conf")):
        subprocess.run(["mount", "--bind", str(path), target], check=True)
    return DnsStub("127.0.0.1", 53).start()


# --------------------------------------------------------------------------
# discovery
# --------------------------------------------------------------------------

def discovery(work: Path, report: dict[str, Any]) -> None:
    stub = point_resolver_at_stub(work)
    args = ("--cluster-discovery", NAME, "--cluster-discovery-interval", "1",
            "--cluster-discovery-forget-time", "3", "--cluster-node-timeout", "1000",
            "--shutdown-timeout", "5", "--metrics-port", str(METRICS))
    nodes: list[Node] = []

    def node(i: int, ip: str) -> Node:
        n = Node(work / f"n{i}", ip, *args)
        nodes.append(n)
        return n

    def expect(members: list[Node], timeout: float = 30) -> dict[str, str]:
        expected = {n.id: n.ip for n in members}
        wait_for(lambda: all_see(members, expected), timeout=timeout, interval=0.1,
                 message=lambda: f"{expected}\n{describe(members)}")
        return expected

    try:
        # Three pods: the first resolution meets the others.
        ips = ["127.0.3.1", "127.0.3.2", "127.0.3.3"]
        stub.set(NAME, ips)
        n1, n2, n3 = (node(i, ip) for i, ip in enumerate(ips, 1))
        t0 = time.monotonic()
        for n in (n1, n2, n3):
            n.start(n.ip)
        expect([n1, n2, n3])
        report["formed_s"] = round(time.monotonic() - t0, 2)
        wait_for(lambda: all(ready(n.ip)[0] == 200 for n in (n1, n2, n3)), timeout=10)

        # Scale up: a fourth address appears, its node joins everybody.
        n4 = node(4, "127.0.3.4")
        stub.set(NAME, [*ips, "127.0.3.4"])
        t0 = time.monotonic()
        n4.start()
        expect([n1, n2, n3, n4])
        report["scale_up_joined_s"] = round(time.monotonic() - t0, 2)

        # Scale down: n4 drains on SIGTERM (its only job goes to a peer),
        # its address leaves DNS, and every other node forgets it.
        job = n4.client().execute_command("ADDJOB", "sd", "payload", 0, "REPLICATE", 1)
        stub.set(NAME, ips)
        n4.stop()
        t0 = time.monotonic()
        expect([n1, n2, n3], timeout=30)
        report["scale_down_forgotten_s"] = round(time.monotonic() - t0, 2)
        holders = [n for n in (n1, n2, n3) if n.client().execute_command("SHOW", job)]
        assert holders, "the drained node's job was lost"
        assert all("forgetting node" in (n.proc.log_text() if n.proc else "")
                   for n in (n1, n2, n3))

        # A restart at a new address, silent for longer than the forget
        # time (as during a long AOF load): nobody forgets it.
        stub.set(NAME, ["127.0.3.1", "127.0.3.2", "127.0.3.5"])
        n3.stop()
        deadline = time.monotonic() + 3 * 3 + 2
        while time.monotonic() < deadline:
            for n in (n1, n2):
                assert n3.id in n.view(), f"{n.ip} forgot the restarting node"
            time.sleep(0.2)
        t0 = time.monotonic()
        old_id = n3.id
        n3.start("127.0.3.5")
        assert n3.id == old_id
        expect([n1, n2, n3])
        report["restart_new_address_rejoined_s"] = round(time.monotonic() - t0, 2)

        # Every pod rescheduled at once, all at new addresses.
        ids = {n.id for n in (n1, n2, n3)}
        for n in (n1, n2, n3):
            n.stop()
        new_ips = ["127.0.3.6", "127.0.3.7", "127.0.3.8"]
        stub.set(NAME, new_ips)
        t0 = time.monotonic()
        for n, ip in zip((n1, n2, n3), new_ips, strict=True):
            n.start(ip)
        assert {n.id for n in (n1, n2, n3)} == ids
        expect([n1, n2, n3])
        report["rescheduled_reformed_s"] = round(time.monotonic() - t0, 2)
        wait_for(lambda: all(ready(n.ip)[0] == 200 for n in (n1, n2, n3)), timeout=10)
        report["dns_queries"] = stub.queries
    finally:
        for n in nodes:
            n.kill()
        stub.stop()


# --------------------------------------------------------------------------
# nat
# --------------------------------------------------------------------------

def nat_rules(count: int) -> str:
    dnat = []
    for i in range(1, count + 1):
        dnat.append(f"ip daddr 127.0.2.{i} tcp dport {8000 + i} dnat to 127.0.1.{i}:{PORT}")
        dnat.append(f"ip daddr 127.0.2.{i} tcp dport {9000 + i} "
                    f"dnat to 127.0.1.{i}:{PORT + 10000}")
    return "\n".join([
        "table ip announce51 {",
        "  chain nat { type nat hook output priority -100;",
        *(f"    {rule}" for rule in dnat),
        "  }",
        "  chain filter { type filter hook output priority 0;",
        # Only translated connections reach the real addresses (both ways).
        "    ip daddr 127.0.1.0/24 ct status dnat accept",
        "    ip saddr 127.0.1.0/24 ct status dnat accept",
        f"    ip daddr 127.0.1.0/24 tcp dport {{ {PORT}, {PORT + 10000} }} "
        "tcp flags & (syn|ack) == syn reject with tcp reset",
        "  }",
        "}",
    ])


def nat(work: Path, report: dict[str, Any], spark: bool) -> None:
    count = 3
    subprocess.run(["nft", "-f", "-"], input=nat_rules(count), text=True, check=True)
    nodes = []
    try:
        for i in range(1, count + 1):
            n = Node(work / f"n{i}", f"127.0.1.{i}", "--cluster-node-timeout", "2000",
                     "--metrics-port", str(METRICS), "--metrics-bind", f"127.0.1.{i}",
                     "--cluster-secret", "netns-scenario-secret-51",
                     "--cluster-announce-ip", f"127.0.2.{i}",
                     "--cluster-announce-port", str(8000 + i),
                     "--cluster-announce-bus-port", str(9000 + i))
            nodes.append(n)
            n.proc = DisqueProcess(n.workdir, "--bind", n.ip, *n.args)
            n.proc.start(port=PORT)
        # The real addresses are out of reach: a direct connection is refused.
        try:
            socket.create_connection(("127.0.1.1", PORT), timeout=3).close()
            raise AssertionError("a real address was reachable")
        except OSError:
            pass
        entry = [redis.Redis(host=f"127.0.2.{i}", port=8000 + i, protocol=2,
                             socket_timeout=10) for i in range(1, count + 1)]
        ids = [c.execute_command("CLUSTER", "MYID").decode() for c in entry]
        for i in range(2, count + 1):
            entry[0].execute_command("CLUSTER", "MEET", f"127.0.2.{i}", 8000 + i, 9000 + i)
        expected = {ids[i - 1]: f"127.0.2.{i}:{8000 + i}@{9000 + i}"
                    for i in range(1, count + 1)}

        def joined() -> bool:
            for c in entry:
                text = c.execute_command("CLUSTER", "NODES").decode()
                view = {f[0]: (f[1], f[2]) for f in (line.split() for line in text.splitlines())}
                if {k: v[0] for k, v in view.items()} != expected:
                    return False
                if any(v[1] not in ("noflags", "myself") for v in view.values()):
                    return False
            return True
        wait_for(joined, timeout=30, interval=0.1,
                 message=lambda: "\n".join(c.execute_command("CLUSTER", "NODES").decode()
                                           for c in entry))
        # Readiness through a partition: node 1 cut off from the others
        # (both ways, on the real addresses, after the translation) stays
        # ready, as they do; the links come back when it heals.
        wait_for(lambda: all(ready(f"127.0.1.{i}") == (200, "ready")
                             for i in range(1, count + 1)), timeout=10)
        others = ", ".join(f"127.0.1.{i}" for i in range(2, count + 1))
        subprocess.run(["nft", "-f", "-"], text=True, check=True, input="\n".join([
            "table ip partition51 {",
            "  chain output { type filter hook output priority 10;",
            f"    ip saddr 127.0.1.1 ip daddr {{ {others} }} drop",
            f"    ip saddr {{ {others} }} ip daddr 127.0.1.1 drop",
            "  }", "}"]))

        def cut_off() -> bool:
            text = entry[0].execute_command("CLUSTER", "NODES").decode()
            return sum(1 for line in text.splitlines() if "fail" in line.split()[2]) == count - 1
        wait_for(cut_off, timeout=30, interval=0.1, message="node 1 to see the others failing")
        assert all(ready(f"127.0.1.{i}") == (200, "ready") for i in range(1, count + 1))
        subprocess.run(["nft", "delete", "table", "ip", "partition51"], check=True)
        wait_for(joined, timeout=30, interval=0.1, message="the partition to heal")
        report["ready_through_partition"] = True

        hello = entry[1].execute_command("HELLO")
        assert sorted((e[1].decode(), int(e[2])) for e in hello[2:]) == [
            (f"127.0.2.{i}", 8000 + i) for i in range(1, count + 1)], hello

        # The Python client: one announced seed, HELLO gives the others.
        from disque import Client
        with Client([f"127.0.2.1:{8001}"]) as client:
            job_ids = [client.add_job("natq", f"job{i}".encode(), replicate=count)
                       for i in range(20)]
            got = []
            while len(got) < 20:
                jobs = client.get_jobs("natq", count=20, timeout_ms=2000)
                assert jobs, "no job came back"
                got += jobs
                for job in jobs:
                    client.ack(job.id)
            assert sorted(j.id for j in got) == sorted(job_ids)
        report["client_jobs"] = len(got)
        if spark:
            report["spark"] = spark_through_nat(work)
    finally:
        for n in nodes:
            n.kill()


def spark_through_nat(work: Path) -> dict[str, int]:
    """The sink writes through one announced seed, the batch source reads back."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from spark_connector.session import local_session

    session = local_session("disque-nat", "local[2]", {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g", "spark.ui.enabled": "false"})
    try:
        rows = [(f"body{i}",) for i in range(200)]
        (session.createDataFrame(rows, ["body"]).repartition(2).write.format("disque")
         .option("nodes", "127.0.2.1:8001").option("queue", "sparknat").mode("append").save())
        read = (session.read.format("disque").option("nodes", "127.0.2.2:8002")
                .option("queues", "sparknat").load())
        listed = read.count()
        query = (session.readStream.format("disque").option("nodes", "127.0.2.3:8003")
                 .option("queues", "sparknat").option("bodyFormat", "string")
                 .option("stagingPath", str(work / "staging")).load()
                 .writeStream.format("memory").queryName("natjobs")
                 .option("checkpointLocation", str(work / "checkpoint")).start())
        try:
            wait_for(lambda: session.sql("select count(*) from natjobs").collect()[0][0] >= 200,
                     timeout=120, interval=0.5, message="Spark to read the 200 jobs")
            assert query.exception() is None
            streamed = session.sql("select count(distinct body) from natjobs").collect()[0][0]
        finally:
            query.stop()
        return {"written": len(rows), "listed": listed, "streamed": streamed}
    finally:
        session.stop()


def main(argv: list[str]) -> int:
    reason = netns.enter("tests.cluster.netns_scenarios", argv)
    if reason is not None:
        print(reason, file=sys.stderr)
        return EXIT_SKIPPED
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="netns51-") as tmp:
        work = Path(tmp)
        try:
            if argv[0] == "discovery":
                discovery(work, report)
            else:
                nat(work, report, "--spark" in argv)
        except Exception:
            traceback.print_exc()
            for log in sorted(work.glob("*/server.log")):
                print(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            print(json.dumps(report))
            return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
