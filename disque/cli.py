"""``disque``: the command-line client, like redis-cli but for Disque.

Usage::

    disque [-h HOST] [-p PORT] [-a PASSWORD] [--raw | --no-raw] [command [arg ...]]
    disque [...] monitor-queues [--interval S] [--count N] [--minlen N]

With a command it runs it once, prints the reply and exits (status 1 if the
reply is an error or no connection could be made).  Without one it opens an
interactive prompt (``127.0.0.1:7711>``) with readline editing and history
kept in ``~/.disque_history`` (or ``$DISQUE_HISTFILE``; ``/dev/null`` keeps
none).

Output follows redis-cli, so people and scripts read it the same way:
formatted (``1) "x"``, ``(integer) 5``, ``(nil)``, ``(error) ERR ...``) when
stdout is a terminal, raw (bare values, one per line) when it is not;
``--raw``/``--no-raw`` force either.  INFO, CLUSTER NODES and CLUSTER INFO
are always printed as raw text, as redis-cli does.

``monitor-queues`` is a live QSTAT view: every ``--interval`` seconds it
lists the node's queues (QSCAN) with their QSTAT counters and in/out rates.

The CLI is built on :class:`disque.Client` with a RESP2 parser that keeps
status replies apart from bulk strings (``PONG`` vs ``"PONG"``), which the
hiredis parser cannot do.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from redis.connection import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from . import __version__
from .client import Client
from .client._cluster import format_address
from .exceptions import ConnectionFailed, DisqueError, ResponseError, error_from_reply

__all__ = ["main", "format_reply", "split_args", "Status"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class Status(bytes):
    """A ``+status`` reply: printed without quotes, like redis-cli does."""


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


# --------------------------------------------------------------------------
# Formatting (cliFormatReplyTTY / cliFormatReplyRaw of redis-cli)
# --------------------------------------------------------------------------

_ESCAPES = {0x5C: "\\\\", 0x22: '\\"', 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t",
            0x07: "\\a", 0x08: "\\b"}


def quote(value: bytes) -> str:
    """A bulk string as redis-cli shows it: quoted, C escapes, ``\\xNN``."""
    out = ['"']
    for byte in value:
        if byte in _ESCAPES:
            out.append(_ESCAPES[byte])
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    out.append('"')
    return "".join(out)


def format_tty(reply: Any, prefix: str = "") -> str:
    """Human-readable form of a reply, ending with a newline."""
    if isinstance(reply, DisqueError):
        return f"(error) {reply}\n"
    if isinstance(reply, Status):
        return reply.decode("utf-8", "replace") + "\n"
    if isinstance(reply, bytes):
        return quote(reply) + "\n"
    if isinstance(reply, bool):
        return f"(integer) {int(reply)}\n"
    if isinstance(reply, int):
        return f"(integer) {reply}\n"
    if reply is None:
        return "(nil)\n"
    if isinstance(reply, list):
        if not reply:
            return "(empty array)\n"
        width = len(str(len(reply)))
        inner = prefix + " " * (width + 2)
        parts = []
        for i, element in enumerate(reply):
            parts.append(f"{prefix if i else ''}{i + 1:>{width}}) ")
            parts.append(format_tty(element, inner))
        return "".join(parts)
    return f"{reply}\n"


def format_raw(reply: Any) -> bytes:
    """Raw form: bare values, array elements one per line (no final newline)."""
    if isinstance(reply, DisqueError):
        return str(reply).encode()
    if isinstance(reply, bytes):
        return reply
    if reply is None:
        return b""
    if isinstance(reply, int):
        return str(int(reply)).encode()
    if isinstance(reply, list):
        return b"\n".join(format_raw(element) for element in reply)
    return str(reply).encode()


def format_reply(reply: Any, raw: bool) -> bytes:
    """The bytes to print for ``reply`` (with the trailing newline)."""
    if raw:
        return format_raw(reply) + b"\n"
    return format_tty(reply).encode("utf-8", "replace")


def _always_raw(args: Sequence[bytes]) -> bool:
    """Commands whose text reply redis-cli prints verbatim even on a terminal."""
    names = [a.lower() for a in args[:2]]
    if names[:1] == [b"info"]:
        return True
    return len(names) == 2 and (names in ([b"cluster", b"nodes"], [b"cluster", b"info"],
                                          [b"client", b"list"], [b"client", b"info"]))


# --------------------------------------------------------------------------
# Splitting an interactive line (sdssplitargs)
# --------------------------------------------------------------------------

_UNESCAPE = {"n": b"\n", "r": b"\r", "t": b"\t", "b": b"\b", "a": b"\a"}
_HEX = "0123456789abcdefABCDEF"


def split_args(line: str) -> list[bytes] | None:
    """Split a prompt line like redis-cli: quotes, ``\\n``, ``\\xNN``.

    Returns None on unbalanced quotes (redis-cli says "Invalid argument(s)").
    """
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i].isspace():
            i += 1
        if i >= n:
            return args
        current = bytearray()
        in_double = in_single = False
        while True:
            if in_double:
                if i >= n:
                    return None
                ch = line[i]
                if (ch == "\\" and i + 3 < n and line[i + 1] == "x"
                        and line[i + 2] in _HEX and line[i + 3] in _HEX):
                    current.append(int(line[i + 2:i + 4], 16))
                    i += 3
                elif ch == "\\" and i + 1 < n:
                    i += 1
                    current += _UNESCAPE.get(line[i], line[i].encode())
                elif ch == '"':
                    if i + 1 < n and not line[i + 1].isspace():
                        return None  # closing quote must be followed by a space
                    in_double = False
                    i += 1
                    break
                else:
                    current += ch.encode("utf-8", "surrogateescape")
            elif in_single:
                if i >= n:
                    return None
                ch = line[i]
                if ch == "\\" and i + 1 < n and line[i + 1] == "'":
                    i += 1
                    current += b"'"
                elif ch == "'":
                    if i + 1 < n and not line[i + 1].isspace():
                        return None
                    in_single = False
                    i += 1
                    break
                else:
                    current += ch.encode("utf-8", "surrogateescape")
            else:
                if i >= n:
                    break
                ch = line[i]
                if ch.isspace():
                    break
                if ch == '"':
                    in_double = True
                elif ch == "'":
                    in_single = True
                else:
                    current += ch.encode("utf-8", "surrogateescape")
            i += 1
        args.append(bytes(current))


# --------------------------------------------------------------------------
# monitor-queues
# --------------------------------------------------------------------------

_COLUMNS = ("queue", "len", "age", "idle", "blocked", "import-rate", "in/s", "out/s",
            "jobs-in", "jobs-out", "dead-lettered", "pause")


def monitor_queues(client: Client, out: IO[bytes], interval: float = 1.0,
                   count: int | None = None, minlen: int | None = None,
                   clear: bool = False, sleep: Callable[[float], None] = time.sleep) -> None:
    """Print a QSTAT table of every queue, refreshed every ``interval`` s.

    ``count`` stops after that many tables (tests and scripts); ``clear``
    redraws in place on a terminal instead of printing one table after the
    other.  Rates are computed from the jobs-in/jobs-out counter deltas.
    """
    previous: dict[str, tuple[int, int]] = {}
    previous_at: float | None = None
    shown = 0
    while True:
        now = time.monotonic()
        names = sorted(set(client.qscan(count=1000, minlen=minlen)))
        stats = [s for s in (client.qstat(name) for name in names) if s is not None]
        rows = []
        elapsed = (now - previous_at) if previous_at is not None else 0.0
        current: dict[str, tuple[int, int]] = {}
        for s in stats:
            name = str(s.get("name", ""))
            jobs_in, jobs_out = int(s.get("jobs-in", 0)), int(s.get("jobs-out", 0))
            current[name] = (jobs_in, jobs_out)
            rate_in = rate_out = ""
            if elapsed > 0 and name in previous:
                rate_in = f"{(jobs_in - previous[name][0]) / elapsed:.1f}"
                rate_out = f"{(jobs_out - previous[name][1]) / elapsed:.1f}"
            rows.append([name, str(s.get("len", "")), str(s.get("age", "")),
                         str(s.get("idle", "")), str(s.get("blocked", "")),
                         str(s.get("import-rate", "")), rate_in, rate_out, str(jobs_in),
                         str(jobs_out), str(s.get("dead-lettered", 0)),
                         str(s.get("pause", ""))])
        previous, previous_at = current, now
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(_COLUMNS)]
        lines = [f"{client.address}  {time.strftime('%H:%M:%S')}  queues: {len(rows)}"]
        lines.append("  ".join(c.upper().ljust(w) if i == 0 else c.upper().rjust(w)
                               for i, (c, w) in enumerate(zip(_COLUMNS, widths, strict=True))))
        for row in rows:
            lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                   for i, (v, w) in enumerate(zip(row, widths, strict=True))))
        text = "\n".join(lines) + "\n"
        if clear:
            text = "\x1b[H\x1b[2J" + text
        elif shown:
            text = "\n" + text
        out.write(text.encode("utf-8", "replace"))
        out.flush()
        shown += 1
        if count is not None and shown >= count:
            return
        sleep(interval)


def _monitor_args(args: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="disque monitor-queues",
                                     description="Live QSTAT view of every queue.")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--count", type=int, default=None, help="stop after N refreshes")
    parser.add_argument("--minlen", type=int, default=None,
                        help="only queues with at least N jobs queued")
    return parser.parse_args(list(args))


# --------------------------------------------------------------------------
# The program
# --------------------------------------------------------------------------

HELP = """\
Disque commands (see the Disque README for details):
  ADDJOB queue job ms-timeout [REPLICATE n] [DELAY s] [RETRY s] [TTL s] [MAXLEN n] [ASYNC]
         [BACKOFF s] [MAXDELIVERIES n] [DEADLETTER queue] [IDMP key [IDMP-WINDOW s]]
         (the last four: extensions, docs/EXTENSIONS.md)
  ADDJOBS queue ms-timeout [ADDJOB's options] BODIES job [job ...]   (extension)
  GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] [WITHLEASE] FROM queue [queue ...]
  ACKJOB id [id ...]      FASTACK id [id ...]     NACK id [id ...] [DELAY s]
  WORKING id              ENQUEUE id [id ...]     DEQUEUE id [id ...]
  DELJOB id [id ...]      SHOW id                 WAITJOB id ms-timeout (extension)
  QLEN queue              QSTAT queue             QPEEK queue count
  QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE n]
  JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s ...] [REPLY all|id]
  PAUSE queue in|out|all|none|state|bcast ...
  INFO [section]  HELLO  PING  CLUSTER MEET ip port | LEAVING [yes|no] | NODES | INFO | ...
Client commands:
  monitor-queues [--interval S] [--count N] [--minlen N]   live QSTAT view (Ctrl-C stops)
  help   clear   quit   exit
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disque", add_help=False,
        description="Command-line client for Disque (like redis-cli).",
        epilog="Without a command, starts an interactive prompt.")
    parser.add_argument("-h", dest="host", default="127.0.0.1", help="server host (127.0.0.1)")
    parser.add_argument("-p", dest="port", type=int, default=7711, help="server port (7711)")
    parser.add_argument("-a", dest="password", default=None,
                        help="password (also $DISQUE_PASSWORD)")
    tls = parser.add_argument_group("TLS (a node's tls-port; like redis-cli)")
    tls.add_argument("--tls", action="store_true", help="connect with TLS")
    tls.add_argument("--cacert", default=None,
                     help="CA certificate file to verify the node (implies --tls)")
    tls.add_argument("--cert", default=None,
                     help="client certificate file, for tls-auth-clients (implies --tls)")
    tls.add_argument("--key", default=None, help="private key file of --cert")
    tls.add_argument("--insecure", action="store_true",
                     help="do not verify the node's certificate (like redis-cli)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--raw", dest="raw", action="store_true", default=None,
                      help="raw output, even on a terminal")
    mode.add_argument("--no-raw", dest="raw", action="store_false",
                      help="formatted output, even when not a terminal")
    parser.add_argument("--help", action="help", help="show this help and exit")
    parser.add_argument("--version", action="version", version=f"disque {__version__}")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="command and arguments")
    return parser


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
        self.raw = options.raw if options.raw is not None else not _isatty(out)
        password = options.password or os.environ.get("DISQUE_PASSWORD") or None
        # No read timeout (GETJOB may block for as long as the user asked);
        # one re-send after a lost connection, like redis-cli's reconnect.
        self.client = CliClient(self.address, password=password, socket_timeout=None,
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
                opts = _monitor_args([os.fsdecode(a) for a in args[1:]])
            except SystemExit as exc:
                return int(exc.code or 0)
            try:
                monitor_queues(self.client, self.out, opts.interval, opts.count, opts.minlen,
                               clear=_isatty(self.out))
            except KeyboardInterrupt:
                self.out.write(b"\n")
            return EXIT_OK
        if name == b"shutdown":
            return self._shutdown(args)
        hint = waiting_hint(args) if _isatty(self.err) else None
        timer = threading.Timer(WAIT_HINT_AFTER_S, self._show_hint, (hint,)) if hint else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            reply: Any
            if name == b"auth" and len(args) in (2, 3):
                reply = self._auth(args[-1])
            else:
                reply = self.client.execute_command(*args)
        except ResponseError as exc:
            reply = exc
        finally:
            if timer is not None:
                timer.cancel()
        raw = self.raw or (_always_raw(args) and isinstance(reply, bytes))
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

    def _auth(self, password: bytes) -> Status:
        """AUTH typed at the prompt: the client must re-handshake with it.

        The client sends AUTH itself before HELLO on every connection, so a
        node that requires a password cannot be used until it knows it.
        """
        self.client.password = os.fsdecode(password)
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

    def interactive(self) -> int:
        readline = _setup_readline()
        history = os.environ.get("DISQUE_HISTFILE") or os.path.expanduser("~/.disque_history")
        if readline is not None and history != os.devnull:
            try:
                readline.read_history_file(history)
            except OSError:
                pass
        connected = self._try_connect()
        try:
            while True:
                prompt = f"{self.address}> " if connected else "not connected> "
                try:
                    line = input(prompt)
                except EOFError:
                    self.out.write(b"\n")
                    break
                except KeyboardInterrupt:
                    self.out.write(b"\n")
                    break
                if not line.strip():
                    continue
                if readline is not None and history != os.devnull:
                    try:
                        readline.write_history_file(history)
                    except OSError:
                        pass
                args = split_args(line)
                if args is None:
                    self.err.write("Invalid argument(s)\n")
                    self.err.flush()
                    continue
                name = args[0].lower()
                if name in (b"quit", b"exit"):
                    break
                if name == b"help":
                    self.out.write(HELP.encode())
                    self.out.flush()
                    continue
                if name == b"clear":
                    self.out.write(b"\x1b[H\x1b[2J")
                    self.out.flush()
                    continue
                try:
                    self.run(args)
                    connected = True
                except KeyboardInterrupt:  # stops a blocked GETJOB, keeps the prompt
                    self.out.write(b"\n")
                    self.out.flush()
                except ConnectionFailed as exc:
                    self.connection_error(exc)
                    connected = False
                except DisqueError as exc:
                    self.out.write(format_reply(exc, self.raw))
                    self.out.flush()
        finally:
            self.client.close()
        return EXIT_OK

    def _try_connect(self) -> bool:
        try:
            self.client.connect()
        except ConnectionFailed as exc:
            self.connection_error(exc)
            return False
        except DisqueError as exc:  # e.g. NOAUTH: still open the prompt
            self.err.write(f"(error) {exc}\n")
            self.err.flush()
            return False
        return True


def _isatty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _setup_readline() -> Any:
    try:
        import readline
    except ImportError:  # no readline on this platform: plain input()
        return None
    readline.set_history_length(1000)
    return readline


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``disque`` script; returns the exit status."""
    parser = _parser()
    options = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if (options.cert is None) != (options.key is None):
        parser.error("--cert and --key go together (a client certificate and its key)")
    out = sys.stdout.buffer
    cli = Cli(options, out, sys.stderr)
    args = [os.fsencode(a) for a in options.command]
    try:
        if args:
            return cli.one_shot(args)
        return cli.interactive()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # piped into head & co: stop quietly, like redis-cli
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
