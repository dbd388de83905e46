"""One CLI session: a client to one node, how to run a command on it and print the reply.

The CLI reads replies with its own RESP2 reader that keeps status replies
apart from bulk strings (``PONG`` vs ``"PONG"``), which redis-py's parsers
do not, and prints them as :mod:`disque.cli.format` says.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import threading
from collections.abc import Sequence
from typing import IO, Any

from redis.connection import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from ..client import Client
from ..client._cluster import format_address
from ..exceptions import ConnectionFailed, DisqueError, ResponseError, error_from_reply
from .format import Status, always_raw, format_reply
from .monitor import monitor_args, monitor_queues
from .redrive import redrive

__all__ = ["EXIT_ERROR", "EXIT_OK", "WAIT_HINT_AFTER_S", "Cli", "CliClient",
           "CliParser", "isatty", "waiting_hint"]

EXIT_OK = 0
EXIT_ERROR = 1


class CliParser(BaseParser):
    """A RESP2 reply reader that keeps status replies apart (:class:`Status`),
    so they print without quotes as in redis-cli; redis-py's parsers return a
    status and a bulk string alike.

    It plugs into the client's redis-py connections through their parser
    interface (``parser_class``: ``on_connect``, ``read_response``,
    ``can_read``, ``on_disconnect``) and reads the connected socket itself:
    ``connection._sock``, which redis-py's own parsers read the same way.
    Error replies become the client's exceptions (the client's parser does
    the same).
    """

    def __init__(self, socket_read_size: int = 65536) -> None:
        self._read_size = socket_read_size
        self._sock: socket.socket | None = None
        self._buffer = bytearray()

    def on_connect(self, connection: Any) -> None:
        self._sock = connection._sock
        self._buffer.clear()

    def on_disconnect(self) -> None:
        self._sock = None
        self._buffer.clear()

    def can_read(self, timeout: float = 0) -> bool:
        if self._buffer:
            return True
        if self._sock is None:
            return False
        readable, _, _ = select.select([self._sock], [], [], timeout)
        return bool(readable)

    def parse_error(self, response: str) -> Any:  # type: ignore[override]
        return error_from_reply(response)

    def read_response(self, disable_decoding: bool = False, **kwargs: Any) -> Any:
        return self._reply()

    def _fill(self) -> None:
        if self._sock is None:
            raise RedisConnectionError("Connection closed by server.")
        data = self._sock.recv(self._read_size)
        if not data:
            raise RedisConnectionError("Connection closed by server.")
        self._buffer += data

    def _line(self) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 2]
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size + 2:
            self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size + 2]
        return data

    def _reply(self) -> Any:
        raw = self._line()
        kind, payload = raw[:1], raw[1:]
        if kind == b"+":
            return Status(payload)
        if kind == b"-":
            return self.parse_error(payload.decode("utf-8", "replace"))
        if kind == b":":
            return int(payload)
        if kind == b"$":
            return None if payload == b"-1" else self._exactly(int(payload))
        if kind == b"*":
            if payload == b"-1":
                return None
            return [self._reply() for _ in range(int(payload))]
        raise InvalidResponse(f"Protocol Error: {raw!r}")


#: A GETJOB that has not answered after this long is shown as waiting.
WAIT_HINT_AFTER_S = 1.0


def waiting_hint(args: Sequence[bytes]) -> str | None:
    """What a GETJOB (or WAITJOB) that may block waits for, in words; None for anything else.

    GETJOB without NOHANG blocks until a job arrives (forever without
    TIMEOUT): on an empty queue the prompt would just hang with no clue.
    """
    if len(args) == 3 and args[0].lower() == b"waitjob":
        job = os.fsdecode(args[1])
        if args[2] == b"0":
            return f"(waiting until job {job} is acknowledged; Ctrl-C stops)"
        if args[2].isdigit():
            return (f"(waiting until job {job} is acknowledged, for up to "
                    f"{int(args[2])} ms; Ctrl-C stops)")
        return None
    if not args or args[0].lower() != b"getjob":
        return None
    words = [a.lower() for a in args[1:]]
    if b"from" not in words:
        return None
    options = words[:words.index(b"from")]
    if b"nohang" in options:
        return None
    queues = ", ".join(os.fsdecode(q) for q in args[1 + words.index(b"from") + 1:])
    timeout = 0
    if b"timeout" in options:
        raw = options[options.index(b"timeout") + 1:options.index(b"timeout") + 2]
        timeout = int(raw[0]) if raw and raw[0].isdigit() else 0
    if timeout:
        return f"(waiting for a job from {queues} for up to {timeout} ms; Ctrl-C stops)"
    return (f"(waiting for a job from {queues} until one arrives; Ctrl-C stops. "
            "NOHANG answers at once, TIMEOUT <ms> bounds the wait)")


class CliClient(Client):
    """The CLI's client: like redis-cli, it talks to a node that wants a password.

    Without a password, a node with ``requirepass`` refuses the HELLO
    handshake; the CLI keeps the connection anyway and lets the node answer
    each command: ``PING`` gets PONG (the node answers it before AUTH, for
    health checks), everything else ``-NOAUTH``, and ``AUTH`` at the prompt
    logs in.
    """

    _hello_optional = True


class Cli:
    """One CLI session: a client, an output mode, and how to print."""

    def __init__(self, options: argparse.Namespace, out: IO[bytes], err: IO[str]) -> None:
        self.options = options
        self.out = out
        self.err = err
        self.address = format_address((options.host, options.port))
        self.raw = options.raw if options.raw is not None else not isatty(out)
        password = options.password or os.environ.get("DISQUE_PASSWORD") or None
        # No read timeout (GETJOB may block for as long as the user asked);
        # one re-send after a lost connection, like redis-cli's reconnect.
        self.client = CliClient(self.address, password=password, username=options.user,
                                socket_timeout=None,
                                connect_timeout=5.0, max_retries=1, reconnect_timeout=0,
                                randomize=False,
                                connection_kwargs={"parser_class": CliParser},
                                tls=options.tls, tls_ca_file=options.cacert,
                                tls_cert_file=options.cert, tls_key_file=options.key,
                                tls_verify=not options.insecure)

    def connection_error(self, exc: BaseException) -> None:
        cause = exc
        if isinstance(exc, ConnectionFailed) and exc.errors:
            cause = next(iter(exc.errors.values()))
        self.err.write(f"Could not connect to Disque at {self.address}: {cause}\n")
        self.err.flush()

    def run(self, args: list[bytes]) -> int:
        """Run one command and print its reply; returns the exit status."""
        name = args[0].lower()
        if name == b"monitor-queues":
            try:
                opts = monitor_args([os.fsdecode(a) for a in args[1:]])
            except SystemExit as exc:
                return int(exc.code or 0)
            try:
                monitor_queues(self.client, self.out, opts.interval, opts.count, opts.minlen,
                               clear=isatty(self.out))
            except KeyboardInterrupt:
                self.out.write(b"\n")
            return EXIT_OK
        if name == b"redrive":
            return redrive(self.options, [os.fsdecode(a) for a in args[1:]], self.out,
                           self.err)
        if name == b"shutdown":
            return self._shutdown(args)
        hint = waiting_hint(args) if isatty(self.err) else None
        timer = threading.Timer(WAIT_HINT_AFTER_S, self._show_hint, (hint,)) if hint else None
        if timer is not None:
            timer.daemon = True
            _start_deaf_to_ctrl_c(timer)
        try:
            reply: Any
            if name == b"auth" and len(args) in (2, 3):
                reply = self._auth(args[-1], args[1] if len(args) == 3 else None)
            else:
                reply = self.client.execute_command(*args)
        except ResponseError as exc:
            reply = exc
        finally:
            if timer is not None:
                timer.cancel()
        raw = self.raw or (always_raw(args) and isinstance(reply, bytes))
        self.out.write(format_reply(reply, raw))
        self.out.flush()
        return EXIT_ERROR if isinstance(reply, DisqueError) else EXIT_OK

    def _show_hint(self, hint: str) -> None:
        self.err.write(hint + "\n")
        self.err.flush()

    def _shutdown(self, args: list[bytes]) -> int:
        """SHUTDOWN: a connection closed without a reply is success (as in redis-cli).

        Never re-sent: after a lost connection the client would move to
        another node of the cluster and shut that one down too.
        """
        self.client.connect()  # connection errors before sending are real errors
        retries, self.client.max_retries = self.client.max_retries, 0
        try:
            reply = self.client.execute_command(*args)
        except ResponseError as exc:
            reply = exc
        except ConnectionFailed:
            return EXIT_OK  # the node closed the connection: it is going down
        finally:
            self.client.max_retries = retries
        self.out.write(format_reply(reply, self.raw))
        self.out.flush()
        return EXIT_ERROR if isinstance(reply, DisqueError) else EXIT_OK

    def _auth(self, password: bytes, user: bytes | None = None) -> Status:
        """AUTH [user] password typed at the prompt: the client must
        re-handshake with it.

        The client sends AUTH itself before HELLO on every connection, so a
        node that requires a password cannot be used until it knows it.
        """
        self.client.password = os.fsdecode(password)
        self.client.username = os.fsdecode(user) if user is not None else None
        self.client.close()
        self.client.connect()
        return Status(b"OK")

    def one_shot(self, args: list[bytes]) -> int:
        try:
            return self.run(args)
        except (ConnectionFailed, DisqueError) as exc:
            if isinstance(exc, ConnectionFailed):
                self.connection_error(exc)
            else:
                self.err.write(f"(error) {exc}\n")
            return EXIT_ERROR
        finally:
            self.client.close()


def isatty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _start_deaf_to_ctrl_c(thread: threading.Thread) -> None:
    """Start ``thread`` with SIGINT blocked in it (it inherits the mask).

    The kernel gives a process's signal to any thread that does not block
    it.  Taken by the hint thread, a Ctrl-C would leave the main thread in
    its blocked read (a GETJOB waiting for jobs) with nothing to wake it.
    """
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
