"""Resource abuse: what each attack of the hardening probe makes a node hold.

Each attack runs against a fresh node; the report gives, per attack, the
node's resident size and ``used_memory`` grown while the attack holds on,
and what became of the attacker (disconnected, refused, or still there).
With ``--before-tree PATH`` every attack also runs against a node started
from another checkout (an older commit, built or not), so that one run
shows the figures before and after a change side by side.

Usage (from the repository root)::

    python3 -m benchmarks.abuse [--before-tree PATH] [--smoke] [--json PATH]

The attacks (docs/SECURITY.md has the limits that answer them):

``preauth-bulk``
    4 connections to a node with ``requirepass`` each start a 60 MB argument
    without authenticating.
``queued-behind-block``
    a client blocked in GETJOB pipelines 20 commands of 30 MB behind it,
    ``client-query-buffer-limit 64mb``.
``reply-amplification``
    a client that never reads sends 400 ``QPEEK`` of a 1 MB job (10 KB of
    requests).
``acl-cache``
    a user limited to ``~tenant:*`` runs 30 ``QLEN`` with 10 MB names, then
    disconnects.
``acl-pattern``
    a user limited to ``~*-*-jobs`` runs one ``QLEN`` on a 40,000-byte name:
    how long the node is frozen.
``getjob-queues``
    ``GETJOB TIMEOUT 1 FROM`` 1,000 names, 200 times, then disconnects: the
    queues left.
``idle-unauth``
    1,000 connections to a node with ``requirepass`` that never authenticate:
    how many are left after 15 s.
``bus-idle-links``
    1,000 idle connections to the cluster bus port: how many are left after
    15 s.
``bus-large-frame``
    on a 2-node cluster with ``cluster-secret``, a stranger sends the header
    of a 100 MB REPLJOB that claims the other node's ID (read from HELLO), then
    the body.
``idle-queues``
    not an attack: how long the node takes to drop 200,000 idle queues (each
    held a job that expired) at its 95% memory level.

``--original PATH`` (default: ``DISQUE_REFERENCE_SERVER``) runs the attacks
the original server can take (no users, no secret) against it too.

``--smoke`` makes every attack a few MB and a few dozen connections: it
keeps the harness working (``tests/benchmarks/test_abuse_smoke.py``) and
measures nothing worth quoting.  Settling waits are fixed pauses: this is a
benchmark reading a process's size after an attack, not a test of a
condition.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.redis_tools import rss_of
from tests.support.cluster import ReferenceProcess, bus_free_port, wait_joined
from tests.support.process import DisqueProcess, raw_command

MB = 1024 * 1024
#: How long an attack is left to take effect before the node is measured.
SETTLE_S = 2.0


@dataclass
class Scale:
    bulk: int
    queued: int
    connections: int
    names: int
    frame: int
    reply: int


FULL = Scale(bulk=60 * MB, queued=30 * MB, connections=1000, names=10 * MB, frame=100 * MB,
             reply=1 * MB)
SMOKE = Scale(bulk=2 * MB, queued=1 * MB, connections=30, names=1 * MB, frame=4 * MB,
              reply=256 * 1024)


def pack(*args: Any) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class Target:
    """Starts nodes of one checkout (ours, or ``--before-tree``'s), or of the
    original server (``original``: only the attacks it can take)."""

    def __init__(self, name: str, root: Path, tree: Path | None,
                 original: str | None = None) -> None:
        self.name = name
        self.root = root
        self.tree = tree
        self.original = original
        self._count = 0

    def node(self, *args: str) -> DisqueProcess:
        self._count += 1
        if self.original is not None:
            return _Original(self.root / f"{self.name}-{self._count}", *args).start()
        program = [sys.executable, "-m", "disque.server"]
        if self.tree is not None:
            # -P: not the working directory (this checkout) first on the path.
            program = ["env", f"PYTHONPATH={self.tree}", sys.executable, "-P", "-m",
                       "disque.server"]
        return DisqueProcess(self.root / f"{self.name}-{self._count}", *args,
                             program=program).start()

    def supports(self, directive: str) -> bool:
        """Whether this checkout knows ``directive`` (the attacks' own
        settings, e.g. a longer max-queue-name-len, are given only then)."""
        env = dict(os.environ)
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        import subprocess
        out = subprocess.run([sys.executable, "-P", "-m", "disque.server", "--print-config"],
                             capture_output=True, text=True, env=env, check=False).stdout
        return f"\n{directive} " in out


#: The password of the nodes the attacks that need one start.
PASSWORD = "s3cret"


def info_field(port: int, section: str, field: str) -> int:
    """One INFO field (authenticating when the node needs it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(pack("AUTH", PASSWORD) + pack("INFO", section))
        data = b""
        while field.encode() + b":" not in data or not data.endswith(b"\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode("latin-1").splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    return -1


class _Original(ReferenceProcess):
    """The original server, ready once it answers a PING at all (with
    requirepass it answers -NOAUTH, which ReferenceProcess does not take)."""

    def start(self, timeout: float = 15.0, port: int | None = None) -> _Original:
        import subprocess
        self.port = port or self.port or bus_free_port()
        cmd = [*self.program, "--port", str(self.port), "--dir", str(self.workdir), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                raw_command(self.port, "PING", timeout=1)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def used_memory(port: int) -> int:
    return info_field(port, "memory", "used_memory")


def is_open(sock: socket.socket) -> bool:
    """Whether the node still holds ``sock`` open (reads what it sent)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def left_open(socks: list[socket.socket], wait_s: float) -> int:
    """How many of ``socks`` the node still holds open after up to ``wait_s``
    (sooner once it closed them all)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = sum(is_open(sock) for sock in socks)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def send_quietly(sock: socket.socket, data: bytes) -> bool:
    """Send ``data``; False once the node closed the connection."""
    try:
        sock.settimeout(5)
        view = memoryview(data)
        while view:
            sent = sock.send(view[:MB])
            view = view[sent:]
        return True
    except (OSError, TimeoutError):
        return False


@contextlib.contextmanager
def measured(node: DisqueProcess, port: int | None = None) -> Iterator[dict[str, Any]]:
    """RSS and used_memory before the block, and while the attack holds on
    (the block's end, after SETTLE_S); the node answering a PING after it."""
    port = port or node.port
    before_rss, before_used = rss_of(node.pid), used_memory(port)
    out: dict[str, Any] = {}
    yield out
    time.sleep(SETTLE_S)
    t0 = time.perf_counter()
    out["rss_delta_mb"] = round((rss_of(node.pid) - before_rss) / MB, 1)
    out["used_memory_delta_mb"] = round((used_memory(port) - before_used) / MB, 1)
    out["ping_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    out["alive"] = node.alive()


def attack_preauth_bulk(target: Target, scale: Scale) -> dict[str, Any]:
    node = target.node("--requirepass", PASSWORD)
    try:
        socks = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(4)]
        with measured(node) as out:
            for sock in socks:
                send_quietly(sock, b"*3\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$%d\r\n" % scale.bulk)
                send_quietly(sock, b"x" * (scale.bulk - 1))
            out["connections_left"] = left_open(socks, 2 * SETTLE_S)
        for sock in socks:
            sock.close()
        return out
    finally:
        node.kill()


def attack_queued_behind_block(target: Target, scale: Scale) -> dict[str, Any]:
    limit = "64mb" if scale is FULL else "4mb"
    # The original has no such directive (its query buffer limit is a fixed 1 GB).
    node = target.node(*(("--client-query-buffer-limit", limit) if target.original is None
                         else ()))
    try:
        sock = socket.create_connection(("127.0.0.1", node.port))
        with measured(node) as out:
            send_quietly(sock, pack("GETJOB", "FROM", "empty"))
            chunk = pack("ECHO", b"e" * scale.queued)
            sent = 0
            for _ in range(20):
                if not send_quietly(sock, chunk):
                    break
                sent += 1
            out["commands_sent"] = sent
            out["connection_left"] = left_open([sock], 2 * SETTLE_S) == 1
        sock.close()
        return out
    finally:
        node.kill()


def attack_reply_amplification(target: Target, scale: Scale) -> dict[str, Any]:
    node = target.node()
    try:
        raw_command(node.port, "ADDJOB", "amp", b"a" * scale.reply, 0)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", node.port))
        with measured(node) as out:
            requests = pack("QPEEK", "amp", 1) * 400
            out["request_bytes"] = len(requests)
            send_quietly(sock, requests)
        sock.close()
        return out
    finally:
        node.kill()


def attack_acl_cache(target: Target, scale: Scale) -> dict[str, Any]:
    node = target.node()
    try:
        raw_command(node.port, "ACL", "SETUSER", "t", "on", ">pw", "~tenant:*", "+@all")
        with measured(node) as out:
            sock = socket.create_connection(("127.0.0.1", node.port))
            send_quietly(sock, pack("AUTH", "t", "pw"))
            replies = b""
            for i in range(30):
                send_quietly(sock, pack("QLEN", b"tenant:" + bytes([65 + i]) * scale.names))
            sock.settimeout(60)
            while replies.count(b"\r\n") < 31:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                replies += chunk
            out["refused"] = replies.count(b"-ERR") + replies.count(b"-NOPERM")
            sock.close()  # what the cache holds stays after the user leaves
        return out
    finally:
        node.kill()


def attack_acl_pattern(target: Target, scale: Scale) -> dict[str, Any]:
    args = ["--max-queue-name-len", "64kb"] if target.supports("max-queue-name-len") else []
    node = target.node(*args)
    try:
        raw_command(node.port, "ACL", "SETUSER", "t", "on", ">pw", "~*-*-jobs", "+@all")
        name = b"-" * (40_000 if scale is FULL else 8_000)
        sock = socket.create_connection(("127.0.0.1", node.port))
        sock.settimeout(600)
        sock.sendall(pack("AUTH", "t", "pw"))
        sock.recv(100)
        t0 = time.perf_counter()
        sock.sendall(pack("QLEN", name))
        reply = sock.recv(65536)
        elapsed = time.perf_counter() - t0
        sock.close()
        return {"name_bytes": len(name), "qlen_s": round(elapsed, 4),
                "reply": reply[:40].decode("latin-1").strip(), "alive": node.alive()}
    finally:
        node.kill()


def attack_getjob_queues(target: Target, scale: Scale) -> dict[str, Any]:
    node = target.node()
    try:
        batches = 200 if scale is FULL else 5
        with measured(node) as out:
            sock = socket.create_connection(("127.0.0.1", node.port))
            sock.settimeout(60)
            for batch in range(batches):
                names = [b"g-%d-%d" % (batch, i) for i in range(1000)]
                sock.sendall(pack("GETJOB", "TIMEOUT", 1, "FROM", *names))
                sock.recv(1000)
            sock.close()
            time.sleep(0.5)
            out["queues_left"] = info_field(node.port, "queues", "registered_queues")
        return out
    finally:
        node.kill()


def _idle_connections(node: DisqueProcess, port: int, count: int) -> dict[str, Any]:
    socks: list[socket.socket] = []
    with measured(node) as out:
        for _ in range(count):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        out["accepted"] = len(socks)
        time.sleep(15)
        out["left_after_15s"] = sum(is_open(sock) for sock in socks)
    for sock in socks:
        sock.close()
    return out


def attack_idle_unauth(target: Target, scale: Scale) -> dict[str, Any]:
    node = target.node("--requirepass", PASSWORD)
    try:
        return _idle_connections(node, node.port, scale.connections)
    finally:
        node.kill()


def attack_bus_idle_links(target: Target, scale: Scale) -> dict[str, Any]:
    node = target.node()
    try:
        return _idle_connections(node, node.port + 10000, scale.connections)
    finally:
        node.kill()


def attack_bus_large_frame(target: Target, scale: Scale) -> dict[str, Any]:
    secret = ("--cluster-secret", "correct-horse-battery-staple")
    a, b = target.node(*secret), target.node(*secret)
    try:
        raw_command(a.port, "CLUSTER", "MEET", "127.0.0.1", b.port)
        wait_joined([a, b])
        peer_id = raw_command(b.port, "CLUSTER", "MYID")
        assert isinstance(peer_id, bytes)
        header = struct.pack(">4sIHHHH40s46s34sHHB3s", b"DbuZ", scale.frame, 1, 0, 4, 0,
                             peer_id, b"", b"", b.port, 0, 0, b"\0\0\0")
        sock = socket.create_connection(("127.0.0.1", a.port + 10000))
        with measured(a) as out:
            ok = send_quietly(sock, header)
            body = b"j" * (scale.frame - len(header) - 1)  # all but its last byte: held
            out["body_sent"] = ok and send_quietly(sock, body)
            out["link_left"] = left_open([sock], 2 * SETTLE_S) == 1
        sock.close()
        return out
    finally:
        a.kill()
        b.kill()


def attack_idle_queues(target: Target, scale: Scale) -> dict[str, Any]:
    """Not an attack: how long idle-queue collection takes to empty a table
    of many idle queues (each held one job, expired), with the node at its
    95% memory level (idle after 2 s rather than 300 s)."""
    node = target.node()
    try:
        count = 200_000 if scale is FULL else 5_000
        with socket.create_connection(("127.0.0.1", node.port), timeout=120) as sock:
            for start in range(0, count, 5000):
                batch = b"".join(pack("ADDJOB", b"idle-%d" % i, "x", 0, "TTL", 1, "RETRY", 0,
                                      "REPLICATE", 1) for i in range(start, start + 5000))
                sock.sendall(batch)
                data = b""
                while data.count(b"\r\n") < 5000:
                    data += sock.recv(1 << 20)
        filled = info_field(node.port, "queues", "registered_queues")
        deadline = time.monotonic() + 120
        while info_field(node.port, "jobs", "registered_jobs") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.5)  # every queue idle for longer than the 95% level's 2 s
        raw_command(node.port, "CONFIG", "SET", "maxmemory", "1")
        t0 = time.perf_counter()
        left = filled
        while left and time.perf_counter() - t0 < 600:
            time.sleep(0.05)
            left = info_field(node.port, "queues", "registered_queues")
        return {"queues": filled, "emptied_s": round(time.perf_counter() - t0, 2),
                "left": left, "alive": node.alive()}
    finally:
        node.kill()


ATTACKS: dict[str, Callable[[Target, Scale], dict[str, Any]]] = {
    "preauth-bulk": attack_preauth_bulk,
    "queued-behind-block": attack_queued_behind_block,
    "reply-amplification": attack_reply_amplification,
    "acl-cache": attack_acl_cache,
    "acl-pattern": attack_acl_pattern,
    "getjob-queues": attack_getjob_queues,
    "idle-unauth": attack_idle_unauth,
    "bus-idle-links": attack_bus_idle_links,
    "bus-large-frame": attack_bus_large_frame,
    "idle-queues": attack_idle_queues,
}
#: What the original server can be put through (it has no users, no secret).
ORIGINAL_ATTACKS = frozenset(("preauth-bulk", "queued-behind-block", "reply-amplification",
                              "getjob-queues", "idle-unauth", "bus-idle-links", "idle-queues"))


def summary(result: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in result.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-tree", type=Path,
                        help="also run every attack on nodes of this checkout")
    parser.add_argument("--original", metavar="PATH",
                        default=os.environ.get("DISQUE_REFERENCE_SERVER"),
                        help="also the original server (default: DISQUE_REFERENCE_SERVER), "
                             "for the attacks it can take")
    parser.add_argument("--smoke", action="store_true", help="small attacks, to check the harness")
    parser.add_argument("--only", action="append", choices=sorted(ATTACKS),
                        help="run only this attack (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    global SETTLE_S
    if args.smoke:
        SETTLE_S = 0.3
    scale = SMOKE if args.smoke else FULL
    root = Path(tempfile.mkdtemp(prefix="bench-abuse-"))
    targets = [Target("after", root, None)]
    if args.before_tree is not None:
        targets.insert(0, Target("before", root, args.before_tree.resolve()))
    if args.original:
        os.environ["DISQUE_REFERENCE_SERVER"] = args.original  # ReferenceProcess reads it
        targets.insert(0, Target("original", root, None, original=args.original))
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in args.only or list(ATTACKS):
            results[name] = {}
            for target in targets:
                if target.original is not None and name not in ORIGINAL_ATTACKS:
                    continue
                print(f"{name} ({target.name}) ...", flush=True)
                results[name][target.name] = ATTACKS[name](target, scale)
                print(f"  {summary(results[name][target.name])}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"smoke": args.smoke, "argv": sys.argv,
                                               "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
