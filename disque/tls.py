"""TLS for client connections (``tls-port``, an extension, off by default).

A second client listener beside ``port``, as Redis does (``tls-port``,
``tls-cert-file``, ``tls-key-file``, ``tls-ca-cert-file``,
``tls-auth-clients``); the plain port stays (it also fixes the cluster bus
port, port + 10000).  Behind the handshake a TLS client is an ordinary
:class:`~disque.connection.ClientConnection`: same commands, same replies.

Sockets are accepted by :class:`TLSListener` rather than by
``create_server(ssl=...)``: asyncio and uvloop report a failed server-side
handshake only in debug mode, and an operator wants to see a client that
speaks plain text to the TLS port or presents a certificate from the wrong
CA.  Failures
are logged rate-limited; the socket is closed and nothing else happens.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .connection import ReplyBatch, connection_factory
from .log import RateLimitedLog

if TYPE_CHECKING:
    from .config import Config
    from .state import ServerState

__all__ = ["HANDSHAKE_TIMEOUT_S", "TLSError", "TLSListener", "cluster_contexts",
           "server_context"]

log = logging.getLogger("disque.tls")

#: A client that has not finished its handshake by then is dropped (it holds
#: a socket and is not yet counted against maxclients).
HANDSHAKE_TIMEOUT_S = 10.0


class TLSError(Exception):
    """The TLS directives do not make a usable server context; shown as is."""


def server_context(config: Config) -> ssl.SSLContext:
    """The SSLContext of the TLS listener, from the ``tls-*`` directives."""
    if not config.tls_cert_file or not config.tls_key_file:
        raise TLSError("tls-port needs tls-cert-file and tls-key-file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as err:
        raise TLSError(f"Failed to load the certificate {config.tls_cert_file!r} and key "
                       f"{config.tls_key_file!r}: {_reason(err)}") from None
    mode = config.tls_auth_clients
    if mode != "no":
        if not config.tls_ca_cert_file:
            raise TLSError(f"tls-auth-clients {mode} needs tls-ca-cert-file (the CA that "
                           "signs client certificates), or set tls-auth-clients no")
        try:
            context.load_verify_locations(cafile=config.tls_ca_cert_file)
        except (OSError, ssl.SSLError) as err:
            raise TLSError(f"Failed to load the CA certificates {config.tls_ca_cert_file!r}: "
                           f"{_reason(err)}") from None
        context.verify_mode = ssl.CERT_REQUIRED if mode == "yes" else ssl.CERT_OPTIONAL
    return context


def cluster_contexts(config: Config) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The cluster bus's contexts with ``tls-cluster yes``: (its listener's,
    its outbound links').

    Mutual TLS, as Redis's cluster bus: both sides present the node's
    certificate and verify the other's against ``tls-ca-cert-file``.  No
    host name is checked (a peer is dialled by the IP address gossip gave,
    which a certificate rarely names): the CA is what admits a node.
    """
    missing = [name for name, value in (("tls-cert-file", config.tls_cert_file),
                                        ("tls-key-file", config.tls_key_file),
                                        ("tls-ca-cert-file", config.tls_ca_cert_file))
               if not value]
    if missing:
        raise TLSError(f"tls-cluster yes needs {', '.join(missing)} (the node's certificate "
                       "and key, and the CA its peers' certificates must chain to)")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        except (OSError, ssl.SSLError) as err:
            raise TLSError(f"Failed to load the certificate {config.tls_cert_file!r} and key "
                           f"{config.tls_key_file!r}: {_reason(err)}") from None
        try:
            context.load_verify_locations(cafile=config.tls_ca_cert_file)
        except (OSError, ssl.SSLError) as err:
            raise TLSError(f"Failed to load the CA certificates {config.tls_ca_cert_file!r}: "
                           f"{_reason(err)}") from None
    return server, client


def _reason(err: BaseException) -> str:
    if isinstance(err, ssl.SSLError) and err.reason:
        return str(err.reason)
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


class TLSListener:
    """The ``tls-port`` listeners: accept, handshake, then a ClientConnection.

    Sockets are accepted here and handed to ``loop.connect_accepted_socket``
    with the context, which returns once the handshake is done or raises
    when it fails: the client's connection only exists after a good
    handshake, and a bad one is logged.
    """

    def __init__(self, state: ServerState, replies: ReplyBatch, context: ssl.SSLContext) -> None:
        self.state = state
        self.replies = replies
        self.context = context
        self._sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures = RateLimitedLog(log)

    def start(self, bind: list[str], port: int, backlog: int) -> None:
        for address in bind:
            host = "" if address in ("*", "0.0.0.0") else address
            try:
                info = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                          flags=socket.AI_PASSIVE)[0]
                sock = socket.socket(info[0], socket.SOCK_STREAM)
            except OSError as err:
                self.stop()
                raise TLSError(f"Could not create the TLS TCP listening socket "
                               f"{address}:{port}: {_reason(err)}") from None
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(info[4])
                sock.listen(backlog)
                sock.setblocking(False)
            except OSError as err:
                sock.close()
                self.stop()
                raise TLSError(f"Could not create the TLS TCP listening socket "
                               f"{address}:{port}: {_reason(err)}") from None
            self._sockets.append(sock)
            self._spawn(self._accept(sock))

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as err:  # out of file descriptors: wait, don't spin
                self._failures.warning(f"TLS port: accept failed: {_reason(err)}")
                await asyncio.sleep(0.1)
                continue
            self._spawn(self._handshake(sock, peer))

    async def _handshake(self, sock: socket.socket, peer: Any) -> None:
        state, replies = self.state, self.replies
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                connection_factory(state, replies), sock, ssl=self.context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as err:
            sock.close()
            address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"
            state.stats.tls_handshake_failures += 1
            self._failures.warning(f"TLS handshake with {address} failed: {_reason(err)}")
