"""A small real DNS server for tests: A records from a dict it can change.

UDP on a loopback address (port 53 inside a test's own network namespace,
where the node's resolver is pointed at it through /etc/resolv.conf), in a
thread.  It answers A queries for the names it holds (every address of the
name, TTL 0: nothing is cached), AAAA with an empty NOERROR answer, and
NXDOMAIN for anything else.  Enough of RFC 1035 for glibc's resolver.
"""

from __future__ import annotations

import socket
import struct
import threading

__all__ = ["DnsStub"]

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1


def _read_name(packet: bytes, pos: int) -> tuple[str, int]:
    labels = []
    while True:
        length = packet[pos]
        pos += 1
        if length == 0:
            return ".".join(labels), pos
        if length & 0xC0:  # a pointer: not in queries, refused
            raise ValueError("compressed name in a query")
        labels.append(packet[pos:pos + length].decode("ascii", "replace"))
        pos += length


class DnsStub:
    """``DnsStub("127.0.0.1")``; ``stub.set("name.test", ["127.0.3.1", ...])``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 53) -> None:
        self.records: dict[str, list[str]] = {}
        self.queries = 0
        self._lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.address = self.sock.getsockname()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="dns-stub", daemon=True)

    def start(self) -> DnsStub:
        self._thread.start()
        return self

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self.records[name.lower().rstrip(".")] = list(addresses)

    def stop(self) -> None:
        self._stop = True
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop:
            try:
                packet, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            try:
                reply = self.answer(packet)
            except (ValueError, IndexError, struct.error):
                continue
            try:
                self.sock.sendto(reply, peer)
            except OSError:
                return

    def answer(self, packet: bytes) -> bytes:
        (query_id, flags, qdcount) = struct.unpack_from(">HHH", packet)
        if qdcount != 1:
            raise ValueError("one question per query")
        name, pos = _read_name(packet, 12)
        qtype, qclass = struct.unpack_from(">HH", packet, pos)
        question = packet[12:pos + 4]
        self.queries += 1
        with self._lock:
            addresses = self.records.get(name.lower().rstrip("."))
        answers = b""
        count = 0
        rcode = 0
        if addresses is None:
            rcode = 3  # NXDOMAIN
        elif qtype == TYPE_A and qclass == CLASS_IN:
            for address in addresses:
                # The name as a pointer to the question (offset 12), TTL 0.
                answers += struct.pack(">HHHIH", 0xC00C, TYPE_A, CLASS_IN, 0, 4)
                answers += socket.inet_aton(address)
                count += 1
        # QR, the query's opcode and RD, RA, and the rcode.
        reply_flags = 0x8000 | (flags & 0x7900) | 0x0080 | rcode
        return struct.pack(">HHHHHH", query_id, reply_flags, 1, count, 0, 0) + question + answers
