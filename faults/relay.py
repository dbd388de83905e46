"""A delaying TCP relay: the slow links (``tc netem`` is not available here).

nft DNAT sends a node's new connections to another node's bus port here
(:class:`faults.nft.Redirect`); the relay connects on to the real port from
the *original source address* (so the far node still sees the right peer
address, which it uses to learn where a node lives) with a socket mark the
nft rules let through, and forwards the bytes of both directions, each
held for ``delay`` seconds.  Order is kept: every chunk waits the same time.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field

from faults.nft import RELAY_MARK


@dataclass
class _Link:
    dst: str
    port: int
    delay: float
    server: asyncio.base_events.Server | None = None
    writers: set[asyncio.StreamWriter] = field(default_factory=set)


class DelayRelay:
    """Relays run on an event loop in a thread of the harness."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="relay",
                                        daemon=True)
        self._thread.start()
        self._links: dict[int, _Link] = {}
        #: Bytes forwarded, for the tests' proof that traffic went through.
        self.forwarded = 0

    def _run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add(self, dst: str, port: int, delay: float) -> int:
        """Start relaying to ``dst:port`` with ``delay`` s each way; its listening port."""
        return self._run(self._add(dst, port, delay))

    async def _add(self, dst: str, port: int, delay: float) -> int:
        link = _Link(dst, port, delay)
        link.server = await asyncio.start_server(
            lambda r, w: self._serve(link, r, w), "127.0.0.1", 0)
        listen_port = link.server.sockets[0].getsockname()[1]
        self._links[listen_port] = link
        return listen_port

    async def _serve(self, link: _Link, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        src = writer.get_extra_info("peername")[0]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, RELAY_MARK)
            sock.bind((src, 0))
            sock.setblocking(False)
            await asyncio.wait_for(self.loop.sock_connect(sock, (link.dst, link.port)), 5)
            up_reader, up_writer = await asyncio.open_connection(sock=sock)
        except (OSError, TimeoutError):
            sock.close()
            writer.close()
            return
        link.writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pump(reader, up_writer, link.delay),
                                 self._pump(up_reader, writer, link.delay))
        finally:
            for w in (writer, up_writer):
                link.writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    delay: float) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                self.forwarded += len(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + delay, data))
        except OSError:
            pass
        queue.put_nowait((0.0, b""))
        try:
            await sender
        except OSError:
            pass

    def clear(self) -> None:
        """Stop every relay and close its connections (the nodes reconnect directly)."""
        self.remove(list(self._links))

    def remove(self, ports: list[int]) -> None:
        """Stop the relays listening on ``ports`` and close their connections."""
        self._run(self._remove(ports))

    async def _remove(self, ports: list[int]) -> None:
        for port in ports:
            link = self._links.pop(port, None)
            if link is None:
                continue
            assert link.server is not None
            link.server.close()
            for w in list(link.writers):
                w.transport.abort()

    def close(self) -> None:
        self.clear()
        self._run(self._cancel_tasks())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    async def _cancel_tasks(self) -> None:
        """The pumps of aborted connections: cancelled, so none outlives the loop."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
