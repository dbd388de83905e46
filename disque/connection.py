"""One client connection: read requests, run them in order, write replies.

An asyncio protocol (its callbacks) rather than streams: every chunk read is
parsed and its commands run in the same callback, and the replies to one
read leave with one ``write``: pipelining costs one syscall per batch, not
per command.
While the AOF logs, replies are not written from that callback: they wait
in the connection until every callback of the current event-loop turn has
run, then :class:`ReplyBatch` runs the persistence hooks once (under
``appendfsync always`` one fsync for all of them: group commit) and writes
each connection's replies with one ``write`` (the original's
``beforeSleep``).  Without an AOF nothing has to be logged first, and the
replies to a read, or a blocked client's wake-up, are written at once;
replies made elsewhere (commands run after a block, overlapped ADDJOBs'
answers) still go through the batch, so a connection that gets several in
one turn writes them together.

Commands of one client run strictly in order.  A command that blocks
(GETJOB waiting for a job) parks the connection: later commands wait in
``pending`` until the reply is sent.  One exception, for producers that
pipeline: an ADDJOB waiting for its copies does not hold back the ADDJOBs
pipelined after it.  They start replicating at once (their copies travel in
the same bus writes) and each reply waits in a :class:`ReplySlot` until the
replies before it are out, so the client still reads them in order; any
other command waits until every earlier ADDJOB has answered, as it would
have in the original, which blocks the whole connection on each one.

Reading goes on while blocked, as in the original, because that is how a
disconnect of a blocked client is noticed (a paused transport never sees the
EOF); only when a client piles up more than ``MAX_PENDING_COMMANDS`` behind
a block does reading stop.

What one client may make the node hold is bounded (docs/SECURITY.md):

* **input**: commands queued behind a blocked one count, with the request
  being read, against ``client-query-buffer-limit``: over it the client is
  disconnected (and logged), as Redis does with its query buffer;
* **output**: commands stop running once a read's replies pass
  :data:`DRAIN_OUTPUT_LIMIT`, and while the transport's write buffer is
  above its high-water mark, reading stops too, so a client that does not
  read its replies cannot make the node produce more of them (a pipeline of
  cheap commands with large replies, QPEEK of big jobs, amplifies nothing);
  what one reply alone adds is held to ``client-output-buffer-limit``;
* **before AUTH** (where a password is needed): Redis's pre-auth limits,
  at most 10 arguments of 16 KB per request (``CommandParser.preauth``),
  requests run a batch at a time (:data:`PREAUTH_BATCH`, and none while
  the replies are unread), and ``auth-timeout`` seconds to authenticate
  (the server's client walk).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from .commands import BLOCKED, CommandClient, execute
from .commands.registry import OptionName, is_option
from .protocol import CommandParser, ProtocolError, ReplyError, encode
from .waiters import NO_REPLY, Waiter, unblock

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["ClientConnection", "ReplyBatch", "connection_factory"]

log: Final = logging.getLogger("disque.connection")

_client_ids = itertools.count(1)
#: Final: compiled, a C static rather than two lookups for every read.
_monotonic: Final = time.monotonic
#: After a blocked client's reply is written (see resume).
_sched_yield: Final = os.sched_yield

#: Commands a client may queue behind a blocked one before reading pauses.
MAX_PENDING_COMMANDS: Final = 10_000
#: ADDJOBs of one client that may wait for their copies at the same time;
#: the next one waits in ``pending`` like any blocked-behind command.
MAX_OVERLAPPED_ADDJOBS: Final = 1024
_ADDJOB: Final = OptionName(b"addjob")
_ADDJOBS: Final = OptionName(b"addjobs")
#: Queued reply bytes after which running a client's commands waits for the
#: next loop turn (the replies are written, back-pressure applies).
DRAIN_OUTPUT_LIMIT: Final = 256 * 1024
#: Requests of a client that has not authenticated run in one go before the
#: rest of its read waits (in the parser, reading paused) for a later loop
#: turn: each is parsed and run on its own (an AUTH may lift the pre-auth
#: limits for the next), so a read of tiny requests (1 MB: 200,000 PINGs)
#: would otherwise hold the loop for all of them.
PREAUTH_BATCH: Final = 256
#: SO_LINGER on, 0 s: close() resets the connection.
_LINGER_RESET: Final = struct.pack("ii", 1, 0)
#: Writes at least this large are checked against client-output-buffer-limit
#: at once (smaller ones only while the transport is above its high-water
#: mark: below it the buffer is small).
LARGE_WRITE: Final = 64 * 1024


class ReplyBatch:
    """Replies produced during one event-loop turn, written after the turn.

    The first reply of a turn schedules :meth:`flush` with ``call_soon``; it
    runs once the turn's ready callbacks (reads, timers) are done: the
    before-reply hooks first (the AOF: nothing may be acknowledged before it
    is logged, and with ``appendfsync always`` synced), then one ``write``
    per connection that has replies.  One per node, made by the server.
    """

    __slots__ = ("_connections", "_scheduled", "_state")

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._connections: list[ClientConnection] = []
        self._scheduled = False

    def add(self, connection: ClientConnection) -> None:
        self._connections.append(connection)
        if not self._scheduled:
            self._scheduled = True
            self._state.event_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        self.write(None)

    def write(self, connections: list[ClientConnection] | None) -> None:
        """Write what the AOF logged, then the queued connections' replies
        (or only ``connections``'s)."""
        try:
            persistence = self._state.logging_persistence
            if persistence is not None:
                # May call drop(): the AOF could not log what they acknowledge.
                persistence.before_reply()
        finally:
            # Even if the AOF failed (a bug: it handles its own I/O errors),
            # every queued connection is written, or it would wait forever.
            if connections is None:
                connections, self._connections = self._connections, []
            for connection in connections:
                connection.send_output()

    def drop(self) -> None:
        """Close the queued connections without their replies: the AOF could
        not write (or sync) records they may acknowledge.  Their clients see
        a lost connection, as after a crash, and cannot take it for a yes."""
        connections, self._connections = self._connections, []
        for connection in connections:
            connection.drop_output()


class ReplySlot(Waiter):
    """The place of one reply among replies that must leave in order.

    A replicating ADDJOB moved out of the connection's way waits here (the
    slot is its ``blocked.client``: :func:`~disque.waiters.unblock` calls
    :meth:`resume`); a reply produced behind it is stored already encoded.
    """

    def __init__(self, connection: ClientConnection, reply: bytes | None = None) -> None:
        super().__init__()
        self.connection = connection
        self.reply = reply

    def resume(self, reply: Any) -> None:
        connection = self.connection
        self.reply = encode(reply, connection.resp3)
        connection.slot_ready()


def _overlappable(argv: list[bytes]) -> bool:
    if not argv:
        return False
    name = argv[0]
    return is_option(name, _ADDJOB) or is_option(name, _ADDJOBS)


class ClientConnection(CommandClient):
    """A client's connection: the event loop's protocol callbacks and the
    command client the command table runs commands for.

    Not an ``asyncio.Protocol`` subclass: event loops call a protocol's
    methods by name (uvloop's transports are not asyncio's classes either),
    and deriving from a Python class would make this one a Python class in
    the compiled core, every field read a dictionary lookup.
    """

    def __init__(self, state: ServerState, batch: ReplyBatch) -> None:
        #: The user this connection authenticated as (acl.py); None until
        #: AUTH when ``default`` needs a password.
        super().__init__(state.acl.initial_user())
        self.state = state
        self._batch = batch
        self._out: list[bytes] = []   # replies waiting for the end of the loop turn
        self._out_bytes = 0
        self.id = next(_client_ids)
        self.transport: asyncio.Transport | None = None
        # The transport's write and is_closing, bound once: compiled code
        # calls a method of the transport by name, a lookup on every reply
        # (~110 instructions of an unpipelined GETJOB's ~11,700).
        self._send: Callable[[bytes], object] = _not_connected
        self._send_closed: Callable[[], bool] = _always_closed
        config = state.config
        self.parser = CommandParser(config.proto_max_bulk_len, config.client_query_buffer_limit)
        self.name = b""
        self.lib_name = b""
        self.lib_ver = b""
        self.addr = "?:0"
        self.laddr = "?:0"
        self.local_ip = "127.0.0.1"
        self.created = time.monotonic()
        self.last_interaction = self.created
        #: Replies owed in order behind overlapped ADDJOBs (see ReplySlot).
        self.slots: deque[ReplySlot] = deque()
        self.pending: deque[list[bytes]] = deque()
        #: The bytes of the arguments of the commands in ``pending``.
        self.pending_bytes = 0
        #: Since when (monotonic s) the unsent replies are above the soft
        #: output limit (0: they are not).
        self._over_soft_since = 0.0
        #: Since when (monotonic s) the connection is without a user, while
        #: it is (auth-timeout; 0: it has one).
        self._unauthenticated_since = self.created
        self._closing = False
        self._close_silently = False
        self._write_paused = False
        self._read_paused = False
        self._protocol_error = ""

    # -- asyncio callbacks --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._send = self.transport.write
        self._send_closed = self.transport.is_closing
        state = self.state
        state.stats.connections_received += 1
        if len(state.clients) >= state.config.maxclients:
            state.stats.rejected_connections += 1
            self.transport.write(b"-ERR max number of clients reached\r\n")
            self.transport.close()
            return
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.addr = _format_addr(peer)
        self.laddr = _format_addr(sock)
        if isinstance(sock, tuple) and sock:
            self.local_ip = sock[0]
        state.clients[self.id] = self

    def connection_lost(self, exc: Exception | None) -> None:
        state = self.state
        state.clients.pop(self.id, None)
        # A client that goes away while blocked leaves nothing behind.
        self._abandon_blocked()
        self.pending.clear()
        self.pending_bytes = 0
        self.transport = None
        # The bound methods hold the transport, which holds us: drop them.
        self._send = _not_connected
        self._send_closed = _always_closed

    def data_received(self, data: bytes) -> None:
        self.state.stats.net_input_bytes += len(data)
        self.last_interaction = _monotonic()
        if self.user is None:
            self._unauthenticated_input(data)
            return
        parser = self.parser
        if parser.preauth:
            parser.preauth = False  # authenticated by an AUTH that was queued (_drain)
        try:
            commands = parser.feed(data)
        except ProtocolError as err:
            self._fail_protocol(err)
            return
        if self.blocked is not None or self.pending:
            self._queue_behind(commands)
            return
        if commands:
            self._run(commands, at_once=True)

    def _queue_behind(self, commands: list[list[bytes]]) -> bool:
        """Queue a read's commands behind the blocked or pending ones; False
        when that put the client over client-query-buffer-limit (it is
        disconnected)."""
        if commands:
            self._defer(commands)
            if len(self.pending) > MAX_PENDING_COMMANDS:
                self._pause_reading()
        parser = self.parser
        if self.pending_bytes + parser.pending_bytes > parser.max_query_buffer:
            self._disconnect_over_input_limit()
            return False
        return True

    def _unauthenticated_input(self, data: bytes) -> None:
        """Input before AUTH, where a password is needed: Redis's pre-auth
        limits, and one request parsed and run at a time, so that an AUTH
        pipelined with what follows lifts the limits for the rest of the read.

        Behind commands still queued (an AUTH that failed among them) a
        request waits its turn, as any client's.  The replies leave together
        at the end of the turn; after :data:`PREAUTH_BATCH` requests, or
        once the replies are not read, the rest of the read waits in the
        parser with reading paused (:meth:`_more_unauthenticated`,
        :meth:`resume_writing`): nobody without the password holds the
        loop, or makes the node hold more than a batch of replies."""
        parser = self.parser
        parser.preauth = True
        budget = PREAUTH_BATCH
        while True:
            try:
                commands = parser.feed(data)
            except ProtocolError as err:
                self._fail_protocol(err)
                return
            data = b""
            if not commands:
                if not self.pending and self.blocked is None:
                    self._resume_reading()
                return
            if self.blocked is not None or self.pending:
                # Queued, in order (parsed with the pre-auth limits: the
                # connection has not authenticated when they are read).
                if not self._queue_behind(commands):
                    return
                continue
            self._run(commands)
            if self._closing or self.transport is None:
                return
            if self.user is not None:
                parser.preauth = False
                self.data_received(b"")  # the rest of the read, as any client's
                return
            if self.pending or self.blocked is not None:
                continue  # it waits behind overlapped ADDJOBs: so do the next
            budget -= 1
            if not budget or self._write_paused or self._out_bytes > DRAIN_OUTPUT_LIMIT:
                # The rest of the read waits in the parser (nothing else of
                # this connection is queued), reading paused.
                self._pause_reading()
                if not self._write_paused:
                    self.state.event_loop().call_soon(self._more_unauthenticated)
                return  # else resume_writing goes on

    def _more_unauthenticated(self) -> None:
        """The rest of a read held back before AUTH (see _unauthenticated_input)."""
        if self.transport is None or self._closing or self._write_paused:
            return  # gone, or resume_writing goes on
        if self.user is None:
            self._unauthenticated_input(b"")
        else:
            self.data_received(b"")

    def _fail_protocol(self, err: ProtocolError) -> None:
        """A malformed request: what came before it runs, then the error is
        answered and the connection closed."""
        self._protocol_error = str(err)
        self._defer(err.commands)
        self.pending.append([])  # marker: reply with the error, then close
        self._drain()

    def _defer(self, commands: list[list[bytes]]) -> None:
        """Queue ``commands`` behind the current block, counting their bytes."""
        pending = self.pending
        size = self.pending_bytes
        for argv in commands:
            pending.append(argv)
            for arg in argv:
                size += len(arg)
        self.pending_bytes = size

    def _disconnect_over_input_limit(self) -> None:
        state = self.state
        state.stats.client_query_buffer_limit_disconnections += 1
        log.warning("Closing client that reached max query buffer length: id=%d addr=%s "
                    "(commands queued behind a blocked one: %d bytes, request being read: "
                    "%d bytes; client-query-buffer-limit %d)", self.id, self.addr,
                    self.pending_bytes, self.parser.pending_bytes, self.parser.max_query_buffer)
        self._disconnect()

    def _disconnect(self) -> None:
        """Drop the connection and what it holds now: its blocked command,
        its queued commands and unsent replies (a client over a limit)."""
        self._abandon_blocked()
        self.pending.clear()
        self.pending_bytes = 0
        self._out = []
        self._out_bytes = 0
        self._closing = True
        if self.transport is not None:
            # A reset rather than a FIN: what the kernel still holds for the
            # client is dropped too (a FIN waits for a reader that may never
            # read: minutes at a small window, megabytes of socket buffer).
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                except OSError:
                    pass
            self.transport.abort()

    def eof_received(self) -> bool | None:
        """The client closed its side: let the transport close ours (None)."""
        return None

    def pause_writing(self) -> None:
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.pending and self.blocked is None:
            self._drain()
        elif (self.user is None and self.blocked is None and self.transport is not None
              and not self._closing):
            self._unauthenticated_input(b"")  # what a read before AUTH still holds
        else:
            self._resume_reading()

    # -- running commands ---------------------------------------------------

    @property
    def is_blocked(self) -> bool:
        """Waiting for a blocked command (GETJOB, or ADDJOBs' copies)."""
        return self.blocked is not None or bool(self.slots)

    def _must_wait(self, argv: list[bytes]) -> bool:
        """With ADDJOBs waiting for copies, only more ADDJOBs may run."""
        return bool(self.slots) and (len(self.slots) >= MAX_OVERLAPPED_ADDJOBS
                                     or not _overlappable(argv))

    def _run(self, commands: list[list[bytes]], at_once: bool = False) -> None:
        """Run commands in order, writing all replies at once (``at_once``:
        now if nothing waits for the AOF, else at the end of the turn)."""
        state = self.state
        out: list[bytes] = []
        out_size = 0
        slots = self.slots
        for index, argv in enumerate(commands):
            if self._closing:
                break
            if slots and self._must_wait(argv):
                self._defer(commands[index:])
                break
            reply = execute(state, self, argv)
            if self._close_silently:
                break  # SHUTDOWN: the reply is the closed connection
            if reply is BLOCKED:
                blocked = self.blocked
                if blocked is not None and blocked.overlappable():
                    if out:  # the replies before it are due first
                        self._write(b"".join(out))
                        out = []
                    self._overlap()
                    continue
                self._defer(commands[index + 1:])
                break
            # Read resp3 after the command: HELLO 3 answers in RESP3 already.
            if slots:
                slots.append(ReplySlot(self, encode(reply, self.resp3)))
            else:
                encoded = encode(reply, self.resp3)
                out.append(encoded)
                out_size += len(encoded)
                if out_size > DRAIN_OUTPUT_LIMIT and index + 1 < len(commands):
                    # The rest runs once these replies are written, and only
                    # while the client reads them (see _drain).
                    self._defer(commands[index + 1:])
                    state.event_loop().call_soon(self._drain)
                    break
        if out:
            if at_once:
                self._reply(b"".join(out))
            else:
                self._write(b"".join(out))
        if self._closing:
            self._finish_close()

    def _drain(self) -> None:
        """Run queued commands until one blocks, the buffer fills or none are left."""
        while self.pending and self.blocked is None and not self._closing:
            if self._write_paused or self._must_wait(self.pending[0]):
                return
            if self._out_bytes > DRAIN_OUTPUT_LIMIT:
                # Let this turn's replies go out first; the transport's
                # pause_writing stops us then if the client does not read.
                self.state.event_loop().call_soon(self._drain)
                return
            argv = self.pending.popleft()
            for arg in argv:
                self.pending_bytes -= len(arg)
            if not argv:  # protocol error marker
                self._write(encode(ReplyError(f"ERR {self._protocol_error}")))
                self._closing = True
                break
            self._run([argv])
        if self._closing:
            self._finish_close()
        elif not self.pending and self.blocked is None:
            self._resume_reading()

    def _overlap(self) -> None:
        """Move the ADDJOB that just blocked into a reply slot: the
        connection goes on with the ADDJOBs pipelined after it."""
        blocked = self.blocked
        assert blocked is not None
        slot = ReplySlot(self)
        slot.blocked = blocked
        blocked.client = slot
        self.blocked = None
        self.slots.append(slot)

    def slot_ready(self) -> None:
        """A slot got its reply: send the replies now due, in order."""
        if self.transport is None:
            return
        slots = self.slots
        out: list[bytes] = []
        while slots and slots[0].reply is not None:
            out.append(slots.popleft().reply)  # type: ignore[arg-type]
        if not out:
            return  # an earlier ADDJOB still waits: nothing is due yet
        self._write(b"".join(out))
        if self.pending:
            # Not now: we may be inside another client's command.
            self.state.event_loop().call_soon(self._drain)
        elif not slots:
            self._resume_reading()

    def _abandon_blocked(self) -> None:
        """The client is gone: undo its blocked command and waiting ADDJOBs."""
        if self.blocked is not None:
            unblock(self.state, self.blocked, NO_REPLY)
        slots, self.slots = self.slots, deque()
        for slot in slots:
            if slot.blocked is not None:
                unblock(self.state, slot.blocked, NO_REPLY)

    def resume(self, reply: Any) -> None:
        """Called when a blocked command completes with ``reply``."""
        if self.transport is None:
            return
        self._reply(encode(reply, self.resp3))
        if not self._out:
            # Written: the client is runnable now.  If the kernel queued it
            # on this CPU (on a VM it often does, rather than wake an idle
            # vCPU), it would wait for the rest of this loop turn (the
            # command that woke it, the other replies); yielding lets it
            # read its job first.  Elsewhere this is a system call that
            # returns at once.  Measured: pickup latency from 1.15x the
            # original's to parity (docs/BENCHMARKS.md).
            _sched_yield()
        if self.pending:
            # Run the rest on the next loop turn: we may be inside another
            # client's command (the one whose job unblocked us).
            self.state.event_loop().call_soon(self._drain)
        else:
            self._resume_reading()

    def _reply(self, data: bytes) -> None:
        """Send ``data`` now when nothing has to be logged first (no AOF
        logging) and nothing of this connection waits in the turn's batch;
        else queue it there.  A blocked client's job then leaves within the
        command that woke it, without a loop callback in between."""
        transport = self.transport
        if self._out or self.state.logging_persistence is not None or transport is None:
            self._write(data)
        elif not self._send_closed():
            self.state.stats.net_output_bytes += len(data)
            self._send(data)
            if len(data) >= LARGE_WRITE or self._write_paused:
                self._check_output_limit()

    def _write(self, data: bytes) -> None:
        """Queue ``data`` for the end of this loop turn (see :class:`ReplyBatch`)."""
        transport = self.transport
        if transport is None or self._send_closed():
            return
        if not self._out:
            self._batch.add(self)
        self._out.append(data)
        self._out_bytes += len(data)

    def drop_output(self) -> None:
        """Discard the replies queued this turn and close (see ReplyBatch.drop)."""
        self._out = []
        self._out_bytes = 0
        if self.transport is not None:
            self.transport.abort()

    def send_output(self) -> None:
        """Write the queued replies (the before-reply hooks have run)."""
        out = self._out
        if not out:
            return
        self._out = []
        self._out_bytes = 0
        data = out[0] if len(out) == 1 else b"".join(out)
        if self.transport is not None and not self._send_closed():
            self.state.stats.net_output_bytes += len(data)
            self._send(data)
            if len(data) >= LARGE_WRITE or self._write_paused:
                self._check_output_limit()

    def _check_output_limit(self) -> None:
        """Disconnect the client if its unsent replies reach the hard limit
        of client-output-buffer-limit (0: none)."""
        hard: int = self.state.config.client_output_buffer_limit.hard
        if hard and self.output_pending() >= hard:
            self._disconnect_over_output_limit("hard", hard)

    def _disconnect_over_output_limit(self, which: str, limit: int) -> None:
        state = self.state
        state.stats.client_output_buffer_limit_disconnections += 1
        log.warning("Client id=%d addr=%s closed for overcoming of output buffer limits: "
                    "%d bytes of replies unsent, over the %s limit of %d "
                    "(client-output-buffer-limit)", self.id, self.addr,
                    self.output_pending(), which, limit)
        self._disconnect()

    def watch(self, now: float, soft: int, soft_seconds: int, auth_timeout: int) -> None:
        """The server's look at every client, once a second: the soft
        output limit (above ``soft`` bytes unsent for ``soft_seconds``) and
        the time to authenticate (``auth_timeout`` s; 0 for neither)."""
        if self.transport is None:
            return
        if self.user is not None:
            self._unauthenticated_since = 0.0
        elif not self._unauthenticated_since:
            # One that had authenticated, then failed an AUTH: counted from
            # the first walk that finds it without a user.
            self._unauthenticated_since = now
        elif auth_timeout and now - self._unauthenticated_since >= auth_timeout:
            self.state.stats.auth_timeout_disconnections += 1
            log.info("Closing client id=%d addr=%s: not authenticated within %d s "
                     "(auth-timeout)", self.id, self.addr, auth_timeout)
            self._disconnect()
            return
        if soft:
            if self.output_pending() <= soft:
                self._over_soft_since = 0.0
            elif not self._over_soft_since:
                self._over_soft_since = now
            elif now - self._over_soft_since >= soft_seconds:
                self._disconnect_over_output_limit(f"soft ({soft_seconds} s)", soft)

    def _pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and self.transport is not None and not self._write_paused:
            self._read_paused = False
            self.transport.resume_reading()

    # -- closing ------------------------------------------------------------

    def close_after_reply(self, silent: bool = False) -> None:
        """QUIT/SHUTDOWN: close once this command's reply is written (or not, if silent)."""
        self._closing = True
        self._close_silently = silent

    def _finish_close(self) -> None:
        if self.transport is not None:
            if self._out:  # the replies before QUIT/SHUTDOWN (and QUIT's own) go out first
                self._batch.write([self])
            if self._close_silently:
                self.transport.abort()
            else:
                self.transport.close()

    def kill(self) -> None:
        """CLIENT KILL, ACL DELUSER, shutdown: close the connection (what is
        written still leaves).  What it queued does not run: the user it
        would run as may be gone, and nobody reads the replies."""
        self._abandon_blocked()
        self.pending.clear()
        self.pending_bytes = 0
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    # -- introspection ------------------------------------------------------

    def output_pending(self) -> int:
        buffered = self.transport.get_write_buffer_size() if self.transport else 0
        return self._out_bytes + buffered

    def input_pending(self) -> int:
        """The request being read, and the commands queued behind a block."""
        return self.parser.pending_bytes + self.pending_bytes

    def describe(self) -> str:
        now = time.monotonic()
        flags = "b" if self.is_blocked else "N"
        return (f"id={self.id} addr={self.addr} laddr={self.laddr} "
                f"name={self.name.decode('latin-1')} age={int(now - self.created)} "
                f"idle={int(now - self.last_interaction)} flags={flags} "
                f"resp={3 if self.resp3 else 2} qbuf={self.input_pending()} "
                f"omem={self.output_pending()} cmd={self.last_command} "
                f"user={self.user.name if self.user is not None else ''} "
                f"lib-name={self.lib_name.decode('latin-1')} "
                f"lib-ver={self.lib_ver.decode('latin-1')}")


def connection_factory(state: ServerState, batch: ReplyBatch) -> Callable[[], asyncio.Protocol]:
    """What ``create_server`` and ``connect_accepted_socket`` take: a
    :class:`ClientConnection` has every method of ``asyncio.Protocol``, which
    event loops call by name (the cast is for the type checker only)."""
    return lambda: cast(asyncio.Protocol, ClientConnection(state, batch))


def _not_connected(data: bytes) -> None:
    raise RuntimeError("the connection has no transport")


def _always_closed() -> bool:
    return True


def _format_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr) if addr else "?:0"
