"""A bus fuzzer that joins the cluster as a real peer (issue 49).

:class:`FuzzPeer` is a node of its own making: it listens on a bus port,
MEETs the target node, answers every PING and MEET with a PONG (signed with
the cluster secret when there is one), so that the target adds it to its
table and proves its link.  Then it sends thousands of mutated but
well-framed job messages (REPLJOB, SETACK, GOTACK, WILLQUEUE, QUEUED,
YOURJOBS, DELJOB, and GOTJOB, ENQUEUE, WORKING, NEEDJOBS): random job IDs,
IDs of real jobs, bad field values, huge counts, wrong body lengths,
truncated or altered job blobs and option trailers.

Meanwhile a client adds jobs replicated between the target and a real
second node and acknowledges some.  The fuzzer names only *sacrificial*
jobs of its own queue, never the *protected* ones the invariants are about:
a peer of the cluster may delete any job it names (DELJOB, SETACK: the
bus trusts its members), so only jobs it does not name must survive.

At the end the target answers clients, every protected job whose ADDJOB
returned an ID and that was not acknowledged is still on both real nodes
(SHOW) and queued where it was added (QLEN), and neither node logged a
traceback.

``DISQUE_BUS_FUZZ_MESSAGES`` (default 6000 per variant) and
``DISQUE_BUS_FUZZ_SECONDS`` (default 15) set the run's length;
``DISQUE_BUS_FUZZ_SEED`` replays a run (the seed is in every failure's
message).
"""

from __future__ import annotations

import os
import random
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
import redis

from disque.cluster import messages as m
from disque.cluster.auth import BusAuth
from disque.job import Job, JobIdGenerator
from disque.job_options import JobExt, bus_trailer
from tests.support.cluster import cluster_view, node_id, show
from tests.support.process import DisqueProcess, free_ports, wait_for

SECRET = "correct horse battery staple"
NODE_TIMEOUT_MS = 5000
MESSAGES = int(os.environ.get("DISQUE_BUS_FUZZ_MESSAGES", "6000"))
SECONDS = float(os.environ.get("DISQUE_BUS_FUZZ_SECONDS", "15"))

#: The queues of the client's jobs: the fuzzer never names them.
PROTECTED_A = b"protected-a"
PROTECTED_B = b"protected-b"
SACRIFICE = b"sacrifice"


# --------------------------------------------------------------------------
# The peer
# --------------------------------------------------------------------------

class FuzzPeer:
    """A fake node: a bus listener that answers PING/MEET, and one outbound
    link to the target for the fuzz.  Its thread reads every socket (the
    target's and the other node's links to it, and the PONGs on its own)."""

    def __init__(self, auth: BusAuth | None) -> None:
        self.id = os.urandom(20).hex()
        self.port = free_ports(1)[0]
        self.auth = auth
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port + 10000))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.readers: dict[socket.socket, m.FrameReader] = {}
        self.received: Counter[int] = Counter()
        self.pongs = 0
        self.out: socket.socket | None = None
        self.reconnects = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def sign(self, message: bytes) -> bytes:
        return self.auth.sign(message) if self.auth is not None else message

    def gossip(self, msg_type: int) -> bytes:
        return self.sign(m.gossip_message(msg_type, self.id, self.port, 0, []))

    # -- the thread -----------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(True)
                    conn.settimeout(10)
                    self._watch(conn)
                    continue
                self._read(sock)

    def _watch(self, sock: socket.socket) -> None:
        with self._lock:
            self.readers[sock] = m.FrameReader()
            self.selector.register(sock, selectors.EVENT_READ)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            if self.readers.pop(sock, None) is not None:
                self.selector.unregister(sock)
            sock.close()

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._forget(sock)
            return
        reader = self.readers.get(sock)
        if reader is None:
            return
        for frame in reader.feed(data):
            msg_type = int.from_bytes(frame[12:14], "big")
            self.received[msg_type] += 1
            if msg_type in (m.PING, m.MEET):
                try:
                    sock.sendall(self.gossip(m.PONG))
                except OSError:
                    self._forget(sock)
                    return
            elif msg_type == m.PONG and sock is self.out:
                self.pongs += 1

    # -- the outbound link ---------------------------------------------------------------

    def connect(self, target: DisqueProcess, first: int) -> None:
        sock = socket.create_connection(("127.0.0.1", target.port + 10000), timeout=10)
        sock.sendall(self.gossip(first))
        self.out = sock
        self._watch(sock)

    def send(self, target: DisqueProcess, data: bytes) -> None:
        """Write on the link to the target, made again (PING first) if it
        was closed: counted, a well-framed message should never close it."""
        for _ in range(3):
            out = self.out
            assert out is not None
            try:
                out.sendall(data)
                return
            except OSError:
                self.reconnects += 1
                self._forget(out)
                self.connect(target, m.PING)
        raise AssertionError("the target keeps closing the fuzzer's link")

    def sync(self, target: DisqueProcess) -> None:
        """Wait until the target has handled everything sent before: it
        answers a PING after the messages before it."""
        before = self.pongs
        self.send(target, self.gossip(m.PING))
        wait_for(lambda: self.pongs > before, timeout=30,
                 message="the target to answer the fuzzer's PING")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in list(self.readers):
            self._forget(sock)
        self.selector.close()
        self.listener.close()


# --------------------------------------------------------------------------
# Mutations
# --------------------------------------------------------------------------

_U32 = struct.Struct("<I")
_BLOB_HEAD = struct.Struct("<I40sBBHIQIIHHI")
JOB_ID_TYPES = [m.SETACK, m.GOTACK, m.WILLQUEUE, m.QUEUED, m.DELJOB, m.GOTJOB, m.ENQUEUE,
                m.WORKING]
#: The issue's seven types weigh most; GOTJOB, ENQUEUE, WORKING and NEEDJOBS less.
TYPE_WEIGHTS = {m.REPLJOB: 4, m.YOURJOBS: 4, m.SETACK: 3, m.GOTACK: 3, m.WILLQUEUE: 3,
                m.QUEUED: 3, m.DELJOB: 3, m.GOTJOB: 1, m.ENQUEUE: 1, m.WORKING: 1,
                m.NEEDJOBS: 1}


class Mutator:
    def __init__(self, rng: random.Random, peer: str, nodes: list[str],
                 sacrificial: list[bytes]) -> None:
        self.rng = rng
        self.peer = peer
        self.nodes = nodes            # the real nodes' IDs
        self.sacrificial = sacrificial
        #: IDs of the jobs its own valid REPLJOBs and YOURJOBS carried: the
        #: target holds some of them, in every state.
        self.created: list[bytes] = []
        self.generators = [JobIdGenerator(n) for n in [peer, *nodes, os.urandom(20).hex()]]

    # -- fields ------------------------------------------------------------------------

    def u32(self) -> int:
        return self.rng.choice([0, 1, 2, 3, 7, 255, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                                self.rng.getrandbits(32), self.rng.randrange(1000)])

    def job_id(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25 and self.sacrificial:
            return rng.choice(self.sacrificial)
        if roll < 0.45 and self.created:
            return rng.choice(self.created)
        if roll < 0.7:
            ttl = rng.choice([1, 60, 3600, 86400 * 365])
            return rng.choice(self.generators).next_id(ttl, rng.choice([0, 1, 60]))
        if roll < 0.8:
            good = bytearray(rng.choice(self.generators).next_id(60, 1))
            good[rng.randrange(40)] = rng.randrange(256)
            return bytes(good)
        return rng.choice([os.urandom(40), bytes(40), b"D" * 40, b"\n" * 40,
                           b"D-" + os.urandom(38)])

    def mflags(self) -> int:
        return self.rng.choice([0, 0, 0, m.MFLAG_NOREPLY, m.MFLAG_INCR_NACKS,
                                m.MFLAG_INCR_DELIV, 7, self.rng.randrange(256)])

    def header_flags(self) -> int:
        return self.rng.choice([0, 0, 0, m.WIRE_FLAGS["leaving"], self.rng.randrange(1 << 16)])

    def sender(self) -> str:
        """Mostly the peer itself; sometimes a real node (a member may claim
        anybody), a stranger, or the target's own ID (dropped)."""
        roll = self.rng.random()
        if roll < 0.9:
            return self.peer
        if roll < 0.95:
            return self.rng.choice(self.nodes)
        return os.urandom(20).hex()

    def queue(self) -> bytes:
        rng = self.rng
        return rng.choice([SACRIFICE, b"fuzz", b"fuzz:" + os.urandom(rng.randrange(1, 8)).hex()
                           .encode(), b"", os.urandom(rng.randrange(1, 64)), b"fuzz:dead",
                           b"x" * rng.choice([200, 5000])])

    # -- messages ----------------------------------------------------------------------

    def message(self) -> bytes:
        types = list(TYPE_WEIGHTS)
        msg_type = self.rng.choices(types, weights=[TYPE_WEIGHTS[t] for t in types])[0]
        if msg_type in (m.REPLJOB, m.YOURJOBS):
            return self.jobs_message(msg_type)
        if msg_type == m.NEEDJOBS:
            name = self.queue()
            return m.queue_message(m.NEEDJOBS, self.sender(), 7000, self.header_flags(),
                                   name, self.u32())
        return self.job_id_message(msg_type)

    def job_id_message(self, msg_type: int) -> bytes:
        rng = self.rng
        sender, flags, mflags = self.sender(), self.header_flags(), self.mflags()
        roll = rng.random()
        if roll < 0.7:
            return m.job_id_message(msg_type, sender, 7000, flags, self.job_id(), self.u32(),
                                    mflags)
        rest = m.header_rest(msg_type, sender, 7000, flags, mflags)
        if roll < 0.9:  # batched (count > 1), sometimes a huge count
            count = rng.choice([2, 3, 17, 64, 1000, rng.randrange(2, 4096)])
            entries = [self.job_id() + struct.pack(">I", self.u32()) for _ in range(count)]
            return m.batch_frame(rest, entries)
        # A body whose length does not fit the type or the count: dropped.
        # (Under SMALL_MESSAGE: a bigger one that is not a job copy closes
        # the link, test_bus_limits.py.)
        count = rng.choice([0, 1, 2, 9, 65535])
        size = rng.choice([0, 1, 40, 43, 45, 87, 44 * min(max(count - 1, 0), 20000)])
        frame = (m.SIGNATURE + struct.pack(">I", m.HEADER_SIZE + size) + rest[:6]
                 + struct.pack(">H", count) + rest[8:] + os.urandom(size))
        return frame

    def blob(self) -> bytes:
        """A job blob (the original's form), valid or damaged."""
        rng = self.rng
        job_id = self.job_id()
        queue = self.queue()
        body = os.urandom(rng.choice([0, 1, 10, 100, 4000, rng.randrange(70_000)]))
        roll = rng.random()
        if roll < 0.6:
            nodes = [n.encode() for n in rng.sample([*self.nodes, self.peer],
                                                    rng.randrange(0, 4))]
        elif roll < 0.8:
            nodes = [os.urandom(20).hex().encode() for _ in range(rng.choice([1, 10, 500]))]
        else:
            nodes = [rng.choice([os.urandom(40), b"\n" * 40, b"myself" + b" " * 34])
                     for _ in range(rng.randrange(1, 4))]
        state = rng.choice([0, 1, 2, 3, rng.randrange(256)])
        fields = (job_id, state, rng.randrange(256), rng.choice([0, 1, 2, 3, 65535]),
                  rng.choice([0, 1, 60, 3600, 0xFFFFFFFF, rng.getrandbits(32)]),
                  rng.choice([0, int(time.time() * 1e9), rng.getrandbits(64)]),
                  rng.choice([0, 0, 1, 0xFFFFFFFF]),
                  rng.choice([0, 1, 1, 60, 0xFFFFFFFF, rng.getrandbits(32)]),
                  rng.choice([0, 1, 65535]), rng.choice([0, 1, 65535]))
        tail = (queue + _U32.pack(len(body)) + body + _U32.pack(len(nodes)) + b"".join(nodes))
        length = 68 + 4 + len(tail)
        blob = bytearray(_BLOB_HEAD.pack(length, *fields, len(queue)) + tail)
        roll = rng.random()
        if roll < 0.5:
            if len(self.created) >= 1000:
                del self.created[:500]
            self.created.append(job_id)
            return bytes(blob)
        if roll < 0.65:  # bytes flipped anywhere
            for _ in range(rng.randrange(1, 6)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        elif roll < 0.75:  # cut short
            del blob[rng.randrange(len(blob)):]
        elif roll < 0.85:  # the length field lies
            _U32.pack_into(blob, 0, max(0, length + rng.choice([-1, 1, -40, 40, 1 << 20])))
        else:  # an inner length or count lies: the queue's, the body's, the nodes'
            at = rng.choice([72, 76 + len(queue), 80 + len(queue) + len(body)])
            _U32.pack_into(blob, at, rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, 41, 0]))
        return bytes(blob)

    def trailer(self, count: int) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            return b""
        if roll < 0.85:
            jobs = []
            for _ in range(count):
                job = Job(b"D-00000000-" + b"0" * 29, b"fuzz", b"")
                job.ext = JobExt(rng.choice([0, 1, 60, 0xFFFFFFFF]),
                                 rng.choice([0, 1, 2, 0xFFFFFFFF]),
                                 rng.choice([b"", b"fuzz:dead", SACRIFICE, os.urandom(8)]),
                                 rng.choice([b"", b"", b"fuzz"]), rng.randrange(32))
                jobs.append(job)
            trailer = bus_trailer(jobs)
            if trailer and rng.random() < 0.3:
                cut = bytearray(trailer)
                cut[rng.randrange(len(cut))] = rng.randrange(256)
                trailer = bytes(cut)
            return trailer
        return b"DQXT" + rng.choice([_U32.pack(0xFFFFFFFF), _U32.pack(count + 5),
                                     os.urandom(rng.randrange(0, 30))])

    def jobs_message(self, msg_type: int) -> bytes:
        rng = self.rng
        blobs = [self.blob() for _ in range(rng.choice([0, 1, 1, 1, 2, 5, 20]))]
        data = b"".join(blobs) + self.trailer(len(blobs))
        numjobs = rng.choice([len(blobs)] * 6 + [0, len(blobs) + 1, 0xFFFFFFFF,
                                                 rng.getrandbits(32)])
        datasize = len(data) if rng.random() < 0.95 else rng.getrandbits(32)
        # Over SMALL_MESSAGE only jobs from a node of the table are taken
        # (a stranger's close the link: test_bus_limits.py).
        sender = self.sender() if len(data) < m.SMALL_MESSAGE // 2 else self.peer
        rest = m.header_rest(msg_type, sender, 7000, self.header_flags(), self.mflags())
        return (m.SIGNATURE + struct.pack(">I", m.HEADER_SIZE + 8 + len(data)) + rest
                + struct.pack(">II", numjobs, datasize) + data)


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

def tracebacks(node: DisqueProcess) -> list[str]:
    text = node.log_text()
    return [line for line in text.splitlines()
            if "Traceback" in line or "Error processing cluster bus message" in line]


def joined_by(node: DisqueProcess, peer: FuzzPeer) -> bool:
    info = cluster_view(node).get(peer.id)
    return info is not None and "handshake" not in info["flags"]


class Client:
    """The honest workload: protected jobs on both real nodes, some acked;
    sacrificial jobs whose IDs the fuzzer gets."""

    def __init__(self, a: DisqueProcess, b: DisqueProcess, rng: random.Random,
                 sacrificial: list[bytes]) -> None:
        self.a, self.b = a.client(), b.client()
        self.rng = rng
        self.sacrificial = sacrificial
        self.protected: dict[bytes, bytes] = {}  # job ID -> its queue
        self.acked: list[bytes] = []
        self.norepl = 0

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        try:
            if roll < 0.5:
                job = self.a.execute_command("ADDJOB", PROTECTED_A, b"p" * rng.randrange(1, 300),
                                             5000, "REPLICATE", 2)
                self.protected[job] = PROTECTED_A
            elif roll < 0.65:
                job = self.b.execute_command("ADDJOB", PROTECTED_B, b"q", 5000, "REPLICATE", 2)
                self.protected[job] = PROTECTED_B
            elif roll < 0.85:
                job = self.a.execute_command("ADDJOB", SACRIFICE, b"s", 5000, "REPLICATE", 2,
                                             "RETRY", rng.choice([1, 2, 60]))
                self.sacrificial.append(job)
            elif self.protected:
                job = rng.choice(list(self.protected))
                del self.protected[job]
                self.acked.append(job)
                node = self.a if rng.random() < 0.7 else self.b
                assert node.execute_command("ACKJOB", job) == 1
        except redis.ResponseError as err:
            if not str(err).startswith("NOREPL"):
                raise
            self.norepl += 1  # not tracked: the client was told it failed


def run_fuzz(a: DisqueProcess, b: DisqueProcess, peer: FuzzPeer, seed: int,
             progress: Callable[[str], None]) -> dict[str, int]:
    rng = random.Random(seed)
    sacrificial: list[bytes] = []
    mutator = Mutator(rng, peer.id, [node_id(a), node_id(b)], sacrificial)
    client = Client(a, b, random.Random(seed + 1), sacrificial)
    for _ in range(20):
        client.step()
    sent = 0
    deadline = time.monotonic() + SECONDS
    while sent < MESSAGES and time.monotonic() < deadline:
        burst = [mutator.message() for _ in range(rng.choice([1, 1, 5, 20, 60]))]
        peer.send(a, b"".join(peer.sign(frame) for frame in burst))
        sent += len(burst)
        client.step()
        if rng.random() < 0.05:
            assert a.client().ping()
    peer.sync(a)
    progress(f"seed {seed}: {sent} messages, {len(client.protected)} protected jobs, "
             f"{len(client.acked)} acked, {client.norepl} NOREPL, "
             f"{len(sacrificial)} sacrificial, {peer.reconnects} reconnects")

    # The node answers, and every protected job not acked is where it was.
    assert a.alive() and b.alive()
    assert a.client().ping() and b.client().ping()
    missing = [(job, queue) for job, queue in client.protected.items()
               if show(a, job) is None or show(b, job) is None]
    assert not missing, f"seed {seed}: protected jobs lost: {missing[:5]}"
    for node, queue in ((a, PROTECTED_A), (b, PROTECTED_B)):
        expected = sum(1 for q in client.protected.values() if q == queue)
        assert node.client().execute_command("QLEN", queue) == expected, f"seed {seed}"
    for job in client.acked:
        for node in (a, b):
            copy = show(node, job)
            assert copy is None or copy[b"state"] == b"acked", (seed, job, copy)
    return {"sent": sent, "protected": len(client.protected), "reconnects": peer.reconnects}


@pytest.mark.parametrize("secret", [False, True], ids=["no-secret", "secret"])
def test_a_peer_sending_mutated_job_messages_harms_nothing(make_cluster, secret: bool,
                                                           capsys) -> None:
    args = ("--cluster-secret", SECRET) if secret else ()
    a, b = make_cluster(2, *args, node_timeout=NODE_TIMEOUT_MS)
    peer = FuzzPeer(BusAuth(SECRET.encode()) if secret else None)
    seed = int(os.environ.get("DISQUE_BUS_FUZZ_SEED", str(random.randrange(1 << 32))))
    try:
        peer.connect(a, m.MEET)
        wait_for(lambda: joined_by(a, peer), message="the target to add the fuzzer")
        peer.sync(a)
        result = run_fuzz(a, b, peer, seed, lambda text: print(text))
        assert result["sent"] >= min(MESSAGES, 1000), result
        # A well-framed message never costs the peer its link.
        assert result["reconnects"] == 0, (seed, result)
        assert peer.received[m.PING] + peer.received[m.MEET] > 0  # it was a real peer
    finally:
        peer.close()
    assert tracebacks(a) == [], f"seed {seed}:\n" + "\n".join(tracebacks(a)[:20])
    assert tracebacks(b) == [], f"seed {seed}"
    assert joined_by(a, peer)  # it stayed a member throughout
