"""The interactive prompt: ``host:port>``, readline editing and history, redis-cli's line syntax."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from ..exceptions import ConnectionFailed, DisqueError
from ..protocol import ProtocolError, split_inline
from .format import format_reply
from .session import EXIT_OK, Cli

__all__ = ["HELP", "interactive", "split_args"]

HELP = """\
Disque commands (see the Disque README for details):
  ADDJOB queue job ms-timeout [REPLICATE n] [DELAY s] [RETRY s] [TTL s] [MAXLEN n] [ASYNC]
         [BACKOFF s] [MAXDELIVERIES n] [DEADLETTER queue] [PRIORITY p] [IDMP key [IDMP-WINDOW s]]
         [HEADER name value ...] [GROUP key]   (the last seven: extensions, docs/EXTENSIONS.md)
  ADDJOBS queue ms-timeout [ADDJOB's options] BODIES job [job ...]   (extension)
  ADDJOBS queue ms-timeout [ADDJOB's options] JOBS n [name value]*n job ...   (extension)
  ADDJOBS queue ms-timeout [ADDJOB's options] GROUPS group job [group job ...]   (extension)
  GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] [WITHLEASE] [WITHHEADERS]
         [WITHGROUP] FROM queue [queue ...]
  ACKJOB id [id ...]      FASTACK id [id ...]     NACK id [id ...] [DELAY s]
  WORKING id              ENQUEUE id [id ...]     DEQUEUE id [id ...]
  DELJOB id [id ...]      SHOW id [NOBODY]        WAITJOB id ms-timeout (extension)
         (SHOW's NOBODY: body-size in place of the body, an extension)
  QLEN queue              QSTAT queue             QPEEK queue count
  QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE n]
  JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s ...] [GROUP key] [REPLY all|id]
  PAUSE queue in|out|all|none|state|bcast ...
  INFO [section]  HELLO  PING  CLUSTER MEET ip port | LEAVING [yes|no] | NODES | INFO | ...
Client commands:
  monitor-queues [--interval S] [--count N] [--minlen N]   live QSTAT view (Ctrl-C stops)
  redrive DEADQUEUE [--to QUEUE] [--rate N] [--journal FILE]  dead letters back to their queue
  help   clear   quit   exit
"""


def split_args(line: str) -> list[bytes] | None:
    """Split a prompt line like redis-cli: quotes, ``\\n``, ``\\xNN``.

    The same splitter as the node's inline requests (both follow the
    original's ``sdssplitargs``).  Returns None on unbalanced quotes
    (redis-cli says "Invalid argument(s)").
    """
    try:
        return split_inline(line.encode("utf-8", "surrogateescape"))
    except ProtocolError:
        return None


def interactive(cli: Cli) -> int:
    """Read commands at a ``host:port>`` prompt until EOF, ``quit`` or Ctrl-C; returns 0."""
    _ctrl_c_interrupts()
    readline = _setup_readline()
    history = os.environ.get("DISQUE_HISTFILE") or os.path.expanduser("~/.disque_history")
    keep_history = readline is not None and history != os.devnull
    if keep_history:
        _on_history_file(readline.read_history_file, history)
    connected = _try_connect(cli)
    try:
        while True:
            prompt = f"{cli.address}> " if connected else "not connected> "
            try:
                line = input(prompt)
            except EOFError:
                cli.out.write(b"\n")
                break
            except KeyboardInterrupt:
                cli.out.write(b"\n")
                break
            if not line.strip():
                continue
            if keep_history:
                _on_history_file(readline.write_history_file, history)
            args = split_args(line)
            if args is None:
                cli.err.write("Invalid argument(s)\n")
                cli.err.flush()
                continue
            name = args[0].lower()
            if name in (b"quit", b"exit"):
                break
            if name == b"help":
                cli.out.write(HELP.encode())
                cli.out.flush()
                continue
            if name == b"clear":
                cli.out.write(b"\x1b[H\x1b[2J")
                cli.out.flush()
                continue
            try:
                cli.run(args)
                connected = True
            except KeyboardInterrupt:  # stops a blocked GETJOB, keeps the prompt
                cli.out.write(b"\n")
                cli.out.flush()
            except ConnectionFailed as exc:
                cli.connection_error(exc)
                connected = False
            except DisqueError as exc:
                cli.out.write(format_reply(exc, cli.raw))
                cli.out.flush()
    finally:
        cli.client.close()
    return EXIT_OK


def _ctrl_c_interrupts() -> None:
    """Ctrl-C at a terminal stops a blocked command, as the prompt says.

    A process started with SIGINT ignored (a script's background job, some
    CI runners) keeps it ignored, and Python then installs no handler: a
    GETJOB waiting for jobs could not be stopped.  At a terminal the user
    is there to press it, so the prompt takes SIGINT back.
    """
    if sys.stdin.isatty() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _try_connect(cli: Cli) -> bool:
    """Connect before the first prompt, so it can say whether the node answers."""
    try:
        cli.client.connect()
    except ConnectionFailed as exc:
        cli.connection_error(exc)
        return False
    except DisqueError as exc:  # e.g. NOAUTH: still open the prompt
        cli.err.write(f"(error) {exc}\n")
        cli.err.flush()
        return False
    return True


def _on_history_file(action: Callable[[str], None], path: str) -> None:
    try:
        action(path)
    except OSError:  # no history yet, or not writable: the prompt works without it
        pass


def _setup_readline() -> Any:
    try:
        import readline
    except ImportError:  # no readline on this platform: plain input()
        return None
    readline.set_history_length(1000)
    return readline
