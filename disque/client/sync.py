# Generated from disque/client/aio.py by scripts/unasync.py: do not edit.
# Edit aio.py and run `python scripts/unasync.py` (tests/client/test_generated.py
# fails while this file is not current).
# ruff: noqa: UP028 - aio.py's async generator cannot `yield from`: its loop stays
"""The synchronous Disque client."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, overload

import redis
import redis.exceptions

from ..exceptions import (
    AuthError,
    ConnectionFailed,
    DisqueError,
    Leaving,
    NoAuth,
    NoJob,
    ProtocolError,
    ResponseError,
)
from . import _wire as w
from . import tracing
from ._base import (
    CONNECT_ERRORS,
    DEFAULTS,
    LINK_ERRORS,
    NETWORK_ERRORS,
    PIPELINE_COMMANDS,
    ROUTED_BY_JOB_ID,
    SWITCH_ERRORS,
    ClientBase,
    chunks,
)
from ._cluster import (
    LEAVING_PRIORITY,
    Address,
    answered_by_own_node,
    format_address,
    job_node_prefix,
)
from ._io import Lock, close_connection, read_reply, sleep
from ._wire import NOJOB_UNKNOWN, Arg, Headers, Hello, Job, Request

__all__ = ["Client"]


def _same_request(req: Request) -> Request:
    """The ``build`` of a chunk whose items are requests already."""
    return req

log = logging.getLogger("disque.client")

#: The settle spans' ``messaging.operation.name`` of each command.
SETTLE_NAMES = {"ACKJOB": "ack", "FASTACK": "fastack", "NACK": "nack"}


class Client(ClientBase):
    """A cluster-aware synchronous Disque client built on redis-py.

    Use it as a context manager and call its methods:
    ``with Client(...) as client:``,
    ``client.add_job("q", b"x")``, ``for name in client.qscan():``.

    The client holds one connection, to one node at a time.  It connects
    lazily (first command, or :meth:`connect`): it tries the given
    addresses in random order until one answers, authenticates, runs
    ``HELLO`` and remembers the node table.  When a node answers
    ``-LEAVING`` or the connection drops, it moves to another node (lower
    HELLO priority first; the failed one last) and re-sends the command, at
    most ``max_retries`` times.  Re-sending after a dropped connection may
    run a command twice (an ADDJOB may add a second copy): Disque is an
    at-least-once system anyway; set ``max_retries=0`` to never re-send.

    Parameters (defaults in :data:`disque.client.DEFAULTS`):

    addresses
        ``"host:port"``, a comma separated list, or an iterable of
        ``"host:port"`` / ``(host, port)``.  Default ``127.0.0.1:7711``.
    password
        Sent with ``AUTH`` on every new connection (``requirepass``).
    username
        The user to authenticate as (``AUTH username password``; users are
        an extension of this server, docs/EXTENSIONS.md); None: ``default``,
        whose password is ``requirepass``.
    socket_timeout
        Seconds to wait for a reply (30).  Blocking commands (GETJOB with a
        timeout, synchronous ADDJOB) get their own timeout added on top, and
        wait forever when the command itself may block forever.  ``None``
        disables it.
    connect_timeout
        Seconds to wait for a TCP connection to one node (2).
    max_retries
        How many times one command is re-sent after a dropped connection or
        ``-LEAVING`` (3).
    reconnect_timeout
        Seconds one search for a node goes on (10): rounds over every known
        node, with a pause between rounds of ``retry_backoff`` seconds
        (0.05) doubling up to ``retry_backoff_max`` (1.0), the last round
        at this deadline.  At least one round is always made; 0 means
        exactly one.  Then ConnectionFailed.
    randomize
        Try nodes of equal priority in random order (True, as the spec
        says); False keeps the order given, for a preferred local node.
    route_by_job_id
        Send ACKJOB, FASTACK, NACK, WORKING and SHOW to the node named in
        each job ID (its creator, which holds a copy), over a second
        connection; the connected node when that one is unknown, failing
        or unreachable (True; see docs/CLIENT.md).
    route_groups
        Send the ADDJOBs of an ordered group (``group=``, ``job_groups=``)
        to the group's home, the first node of the key's rendezvous
        ranking among the nodes HELLO lists, over a connection of their own,
        and to the next node by rank while that one is unreachable, leaving
        or refuses groups (an original node); the connected node when no
        node of the ranking answers (True; see docs/CLIENT.md).  The nodes
        copy the group's jobs to the next nodes of the same ranking, and
        after a failure the best ranked node holding them queues the group
        again (docs/EXTENSIONS.md, "Ordered groups").  Jobs without a group
        are not routed.
    affinity, affinity_window, affinity_threshold
        Consumer affinity (off): after ``affinity_window`` (200) received
        jobs, if one node created at least ``affinity_threshold`` (0.6) of
        them and HELLO lists it as usable, move to it.
    client_name
        ``CLIENT SETNAME`` on every connection (shows in CLIENT LIST).
    tls, tls_ca_file, tls_cert_file, tls_key_file, tls_check_hostname, tls_verify
        TLS to the nodes' ``tls-port`` (an extension, docs/EXTENSIONS.md):
        ``tls_ca_file`` verifies the node's certificate (the system's CAs
        when None), ``tls_cert_file``/``tls_key_file`` are the client's
        certificate for ``tls-auth-clients yes``; the node's name must match
        its certificate unless ``tls_check_hostname=False``;
        ``tls_verify=False`` accepts any certificate (tests only).  Giving a file
        turns TLS on.  Over TLS only the given addresses are dialled (HELLO
        lists plain ports): list every node's TLS address.
    connection_kwargs
        Extra keyword arguments for ``redis.Connection`` (advanced).
    rng
        The ``random.Random`` used to shuffle nodes (seed it to replay an order).

    A client is safe to share between threads (commands are serialized on its
    connection); give each consumer thread its own client so blocking GETJOBs
    do not queue behind one another.
    """

    #: Keep a connection whose HELLO got -NOAUTH when no password was given
    #: (the CLI, like redis-cli: the node then answers each command itself,
    #: PING with PONG).  A program wants the error at connect instead.
    _hello_optional = False

    def _init_connection_state(self) -> None:
        self._conn: redis.Connection | None = None
        self._hello: Hello | None = None
        self._lock = Lock()
        #: node ID -> connection for commands about the jobs it created.
        self._routes: dict[str, redis.Connection] = {}

    # ---------------------------------------------------------- connection

    def connect(self) -> Hello:
        """Connect now (if not connected) and return the node's HELLO."""
        with self._lock:
            self._connection()
            assert self._hello is not None
            return self._hello

    def close(self) -> None:
        """Close the connection; the next command reconnects."""
        with self._lock:
            conn, self._conn = self._conn, None
            self._address = self._node_id = None
            if conn is not None:
                close_connection(conn, wait=self.tls)
            for node_id in list(self._routes):
                self._close_route(node_id)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.address or "not connected"
        return f"<disque.Client {where} seeds={','.join(self.seeds)}>"

    def _connection(self) -> redis.Connection:
        if self._conn is None:
            self._connect_any()
        assert self._conn is not None
        return self._conn

    def _connect_any(self) -> None:
        deadline = time.monotonic() + self.reconnect_timeout
        errors: dict[str, BaseException] = {}
        delays = self._reconnect_delays()
        while True:
            for address in self._table.candidates(self._avoid):
                try:
                    conn, hello = self._open(address)
                except AuthError:
                    raise
                except CONNECT_ERRORS as exc:
                    errors[format_address(address)] = exc
                    continue
                self._adopt(address, conn, hello)
                return
            # The last pause ends at the deadline, for one more round there:
            # a node that comes back just in time is found.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionFailed("no Disque node reachable: "
                                       + self._describe_errors(errors), errors)
            sleep(min(next(delays), remaining))

    def _open(self, address: Address) -> tuple[redis.Connection, Hello]:
        """A new connection to ``address``, authenticated, with its HELLO."""
        options = {**w.connection_options(asynchronous=False), **self._tls_options,
                   **self.connection_kwargs}
        connection_class = (redis.SSLConnection if self.tls
                            else redis.Connection)
        conn = connection_class(host=address[0], port=address[1],
                                socket_timeout=self.socket_timeout,
                                socket_connect_timeout=self.connect_timeout,
                                socket_keepalive=True, **options)
        try:
            conn.connect()
            if self.password is not None:
                credentials = ((self.password,) if self.username is None
                               else (self.username, self.password))
                self._roundtrip(conn, w.request("AUTH", *credentials))
            if self.client_name:
                self._roundtrip(conn, w.request("CLIENT", "SETNAME", self.client_name))
            try:
                hello = w.parse_hello(self._roundtrip(conn, w.hello()))
            except NoAuth:
                if self.password is not None or not self._hello_optional:
                    raise
                hello = w.NO_HELLO
        except BaseException:
            close_connection(conn)
            raise
        return conn, hello

    def _adopt(self, address: Address, conn: redis.Connection,
               hello: Hello) -> None:
        old = self._conn
        if hello is not w.NO_HELLO:
            self._table.learn(address, hello)
        self._conn, self._address, self._hello = conn, address, hello
        self._node_id = hello.node_id or None
        self._avoid = None
        if old is not None and old is not conn:
            close_connection(old)
        log.debug("connected to %s (node %s)", format_address(address), hello.node_id)

    def _drop(self) -> None:
        """Forget the current connection; the next connect tries it last."""
        conn, self._conn = self._conn, None
        if self._address is not None:
            self._avoid = self._address
        self._address = self._node_id = None
        if conn is not None:
            close_connection(conn)

    def _read(self, conn: redis.Connection, wait: float | None) -> Any:
        """One reply, to a command the node may hold ``wait`` seconds on purpose."""
        return read_reply(conn, self._read_timeout(wait))

    def _roundtrip(self, conn: redis.Connection, req: Request) -> Any:
        conn.send_command(*req.args)
        return w.raise_if_error(self._read(conn, req.wait))

    # ------------------------------------------------------------ execution

    def _execute(self, req: Request) -> Any:
        """Run one request (see :meth:`_execute_locked`)."""
        with self._lock:
            return self._execute_locked(req)

    def _execute_locked(self, req: Request) -> Any:
        """Run one request, moving to another node on LEAVING or a lost link."""
        attempt = 0
        while True:
            conn = self._connection()
            address = self.address or "?"
            try:
                reply = self._roundtrip(conn, req)
            except Leaving:
                self._table.mark_leaving(self._node_id)
                self._drop()
                if attempt >= self.max_retries:
                    raise
            except DisqueError:
                raise  # an error reply: the connection is fine
            except NETWORK_ERRORS as exc:
                self._drop()
                if attempt >= self.max_retries:
                    raise ConnectionFailed(f"connection to {address} lost: {exc}",
                                           {address: exc}) from exc
            except redis.exceptions.InvalidResponse as exc:
                self._drop()
                raise ProtocolError(str(exc)) from exc
            except BaseException:
                self._drop()  # interrupted mid-read: a reply is pending
                raise
            else:
                return req.parse(reply)
            attempt += 1
            log.info("retrying %s on another node (attempt %d)",
                     req.args[0].decode(errors="replace"), attempt)

    def _execute_many(self, reqs: list[Request]) -> list[Any]:
        """Pipeline requests; one result or DisqueError per request, in order.

        Requests answered ``-LEAVING`` are re-sent on another node; after a
        dropped connection the requests not answered yet are re-sent (those
        answered before the drop keep their answer: an ADDJOB that got its
        ID is not sent twice).
        """
        results: list[Any] = [None] * len(reqs)
        pending = list(range(len(reqs)))
        attempt = 0
        with self._lock:
            while pending:
                conn = self._connection()
                address = self.address or "?"
                replies: list[Any] = []
                try:
                    conn.send_packed_command(
                        [w.pack_commands([reqs[i].args for i in pending])])
                    for i in pending:
                        replies.append(self._read(conn, reqs[i].wait))
                except NETWORK_ERRORS as exc:
                    self._drop()
                    pending = w.unanswered(reqs, pending, replies, results)
                    if attempt >= self.max_retries:
                        raise ConnectionFailed(f"connection to {address} lost: {exc}",
                                               {address: exc}) from exc
                    attempt += 1
                    continue
                except BaseException:
                    self._drop()
                    raise
                again = w.sort_replies(reqs, pending, replies, results)
                if again:
                    self._table.mark_leaving(self._node_id)
                    self._drop()
                    if attempt >= self.max_retries:
                        break
                    attempt += 1
                pending = again
        return results

    # ------------------------------------------------- routing by job ID

    def _route_connection(self, node_id: str) -> redis.Connection | None:
        """The connection to ``node_id`` for commands about its jobs, or None
        (call with the lock held)."""
        conn = self._routes.get(node_id)
        if conn is not None:
            return conn
        address = self._table.address_of(node_id)
        if address is None:
            return None
        try:
            conn, hello = self._open(address)
        except SWITCH_ERRORS as exc:
            log.info("job routing: %s unreachable (%s); using the connected node",
                     format_address(address), exc)
            self._route_failed(node_id)
            return None
        if hello.node_id != node_id:  # another node answers there now
            close_connection(conn)
            self._route_failed(node_id)
            return None
        self._table.learn(address, hello)
        self._routes[node_id] = conn
        return conn

    def _close_route(self, node_id: str) -> None:
        conn = self._routes.pop(node_id, None)
        if conn is not None:
            close_connection(conn, wait=self.tls)

    def _route_failed(self, node_id: str) -> None:
        self._close_route(node_id)
        if self._router is not None:
            self._router.failed(node_id)

    def _execute_routed(self, node_id: str | None, req: Request) -> Any:
        """Run ``req`` on ``node_id``; on the connected node when that is
        None, unreachable, leaving, or the link breaks (then the command is
        re-sent there: ACKJOB and friends are safe to repeat)."""
        if node_id is not None:
            with self._lock:
                conn = self._route_connection(node_id)
                if conn is not None:
                    try:
                        return req.parse(self._roundtrip(conn, req))
                    except Leaving:
                        self._table.mark_leaving(node_id)
                        self._route_failed(node_id)
                    except DisqueError:
                        raise
                    except LINK_ERRORS as exc:
                        log.info("job routing: lost %s (%s); using the connected node",
                                 node_id[:8], exc)
                        self._route_failed(node_id)
                    except BaseException:
                        self._close_route(node_id)  # reply pending: unusable
                        raise
        return self._execute(req)

    def _execute_many_routed(self, node_id: str | None, reqs: list[Request],
                             answered: list[str | None] | None = None) -> list[Any]:
        """Pipelined :meth:`_execute_routed`: one result or error per request.

        What the job's node did not answer (link lost, or ``-LEAVING``) is
        sent to the connected node.  ``answered``, when given, gets the ID
        of the node that answered each request.
        """
        if node_id is None:
            results = self._execute_many(reqs)
            if answered is not None:
                answered[:] = [self._node_id] * len(reqs)
            return results
        results = [None] * len(reqs)
        again = list(range(len(reqs)))
        with self._lock:
            conn = self._route_connection(node_id)
            if conn is not None:
                replies: list[Any] = []
                try:
                    conn.send_packed_command([w.pack_commands([r.args for r in reqs])])
                    for r in reqs:
                        replies.append(self._read(conn, r.wait))
                except LINK_ERRORS as exc:
                    log.info("job routing: lost %s (%s); using the connected node",
                             node_id[:8], exc)
                    self._route_failed(node_id)
                except BaseException:
                    self._close_route(node_id)
                    raise
                again = w.unanswered(reqs, again, replies, results)
                if again and len(replies) == len(reqs):  # all answered: some -LEAVING
                    self._table.mark_leaving(node_id)
                    self._route_failed(node_id)
        if answered is not None:
            answered[:] = [node_id] * len(reqs)
        if again:  # not answered there: the connected node (outside the lock)
            for i, result in zip(again, self._execute_many([reqs[i] for i in again]),
                                 strict=True):
                results[i] = result
                if answered is not None:
                    answered[i] = self._node_id
        return results

    def _learn_cluster(self) -> None:
        """Connect, and so learn the node table (HELLO), before routing.

        A client that has not connected yet knows only its seeds: it would
        send a command about a job to whichever seed it reaches, which holds
        no copy of a job created elsewhere (WORKING and NACK then do nothing
        and answer NOJOB or 0).
        """
        if self._router is not None and self._conn is None:
            with self._lock:
                self._connection()

    def send_pipeline(self, build: Callable[[str | None], tuple[bytes, int]], *,
                      wait: float | None = 0.0) -> w.PipelineReplies:
        """Send one pipeline of commands encoded by the caller, once; read its replies.

        For callers that build RESP themselves and keep their own retry
        policy (the Spark sink).  ``build(node_id)`` is called once
        connected, since what to send may depend on the node: it returns
        the encoded commands and how many replies they ask for.  Nothing is
        re-sent: when the connection drops, the replies read so far come
        back with the error, and the connection is dropped (the next call
        connects again, that node last).  ``wait`` is how long the node may
        hold a reply on purpose (a synchronous ADDJOB's timeout), on top of
        the socket timeout.  See :class:`PipelineReplies`.
        """
        with self._lock:
            try:
                conn = self._connection()
            except ConnectionFailed as exc:
                return w.PipelineReplies([], 0, exc)
            address, node_id = self.address or "?", self.node_id
            payload, count = build(node_id)
            replies: list[Any] = []
            try:
                conn.send_packed_command([payload])
                for _ in range(count):
                    replies.append(self._read(conn, wait))
            except NETWORK_ERRORS as exc:
                self._drop()
                return w.PipelineReplies(replies, count, ConnectionFailed(
                    f"connection to {address} lost after {len(replies)} of {count} "
                    f"replies: {exc}", {address: exc}), node_id)
            except BaseException:
                self._drop()  # replies pending: the connection is unusable
                raise
        return w.PipelineReplies(replies, count, None, node_id)

    def drop_node(self, *, leaving: bool = False) -> None:
        """Close the connection; the next command connects again, to this node last.

        ``leaving=True`` also marks the node as leaving in the node table,
        as a ``-LEAVING`` reply does (for a caller that read that reply
        itself, e.g. in :meth:`send_pipeline`'s replies).
        """
        with self._lock:
            if leaving:
                self._table.mark_leaving(self._node_id)
            self._drop()

    def execute_command(self, *args: Arg) -> Any:
        """Send any command; the raw reply (bytes, int, None, lists) comes back.

        Error replies raise the matching :mod:`disque.exceptions` class.
        Use it for commands without a method (CONFIG REWRITE, DEBUG ...).
        """
        if not args:
            raise ValueError("execute_command needs a command name")
        return self._execute(w.request(*args))

    # ---------------------------------------------------------------- jobs

    def add_job(self, queue: Arg, body: Arg, *, timeout_ms: int = 0,
                replicate: int | None = None, delay: int | None = None,
                retry: int | None = None, ttl: int | None = None,
                maxlen: int | None = None, async_: bool = False,
                backoff: int | None = None, max_deliveries: int | None = None,
                dead_letter: Arg | None = None, idmp: Arg | None = None,
                idmp_window: int | None = None, priority: int | None = None,
                headers: Headers | None = None, group: Arg | None = None) -> str:
        """ADDJOB: queue ``body`` and return the job ID.

        ``timeout_ms`` is how long the node may wait for replication (0 =
        forever, as in Disque); ``delay``, ``retry`` and ``ttl`` are seconds;
        ``async_`` replicates in the background and answers at once.
        Extensions of this server (docs/EXTENSIONS.md): ``backoff`` caps an
        exponential re-queue delay (seconds), ``max_deliveries`` moves the
        job to ``dead_letter`` (default ``<queue>:dead``) after that many
        deliveries; ``idmp`` is an idempotency key: a retry with the same
        key in the same queue within ``idmp_window`` seconds (default 300)
        returns the first job's ID instead of adding a job, and the same key
        with another body raises ``IdmpConflict``; ``priority`` (0 to 31,
        None: the node's default 0) puts the job ahead of every job of a
        lower priority in its queue (an original node answers a syntax error);
        ``headers`` (a mapping of names to values, or (name, value) pairs)
        travel with the job and come back with ``get_jobs(...,
        with_headers=True)``: names are text, values bytes or text (an
        original node answers a syntax error); ``group`` (a non-empty key)
        puts the job in an ordered group of its queue: the group's jobs are
        handed out in the order they were added, one consumer at a time
        (docs/EXTENSIONS.md, "Ordered groups"; not with ``delay``).  When
        OpenTelemetry is set up, the job's creation context goes in its
        headers (docs/TRACING.md).
        """
        otel = tracing.telemetry()
        if otel is None:
            req = w.add_job(queue, body, timeout_ms, replicate, delay, retry, ttl, maxlen,
                            async_, backoff, max_deliveries, dead_letter, idmp, idmp_window,
                            priority, headers, group)
            if group is None or self._groups is None:
                return self._execute(req)
            return self._execute_in_group(group, req)
        # Only here, not above: a closure would cost every untraced call.
        make = functools.partial(w.add_job, queue, body, timeout_ms, replicate, delay, retry,
                                 ttl, maxlen, async_, backoff, max_deliveries, dead_letter,
                                 idmp, idmp_window, priority, group=group)
        return self._add_job_traced(otel, queue, headers, make, group)

    def _add_job_traced(self, otel: tracing.Telemetry, queue: Arg,
                        headers: Headers | None,
                        make: Callable[[Headers | None], Request],
                        group: Arg | None = None) -> str:
        """:meth:`add_job` under a ``send`` span, its creation context in the headers."""
        with otel.send(queue, headers, self.address) as send:
            if send.headers is headers or self._node_id in self._no_headers:
                job_id: str = self._execute_in_group(group, make(headers))
            else:
                try:
                    job_id = self._execute_in_group(group, make(send.headers))
                except ResponseError as err:
                    if not w.headers_refused(err):
                        raise
                    # A node without headers (an original) or refusing them:
                    # the job goes without its context, as without tracing.
                    self._no_headers.add(self._node_id)
                    job_id = self._execute_in_group(group, make(headers))
            send.sent(job_id, self.address)
        return job_id

    @overload
    def add_jobs(self, queue: Arg, bodies: Iterable[Arg], *,
                 return_exceptions: Literal[False] = ..., batch_size: int = ...,
                 job_headers: Iterable[Headers | None] | None = ...,
                 job_groups: Iterable[Arg | None] | None = ...,
                 **options: Any) -> list[str]: ...

    @overload
    def add_jobs(self, queue: Arg, bodies: Iterable[Arg], *,
                 return_exceptions: Literal[True], batch_size: int = ...,
                 job_headers: Iterable[Headers | None] | None = ...,
                 job_groups: Iterable[Arg | None] | None = ...,
                 **options: Any) -> list[str | DisqueError]: ...

    def add_jobs(self, queue: Arg, bodies: Iterable[Arg], *,
                 return_exceptions: bool = False,
                 batch_size: int = DEFAULTS["batch_size"],
                 job_headers: Iterable[Headers | None] | None = None,
                 job_groups: Iterable[Arg | None] | None = None,
                 **options: Any) -> list[Any]:
        """Add many jobs to ``queue``: one ADDJOBS per ``batch_size`` bodies
        (at most 10,000) where the node has this bulk extension, pipelined
        ADDJOBs (``batch_size`` per round trip) on an original node.

        ``options`` are those of :meth:`add_job` (with ``idmp``, which names
        one job, pipelined ADDJOBs are always used).  Returns the job IDs in
        order.  On an error reply, without ``return_exceptions`` the first
        error is raised once the batch containing it was sent (jobs of that
        batch may have been added; later batches are not sent); with it,
        the error takes that job's place in the list.

        ``options["headers"]`` go to every job; ``job_headers`` gives each
        job its own, one entry (headers, or None) per body in order, sent as
        ``ADDJOBS ... JOBS`` (or ADDJOBs with HEADER on a node without it).
        ``options["group"]`` puts every job in that ordered group, in body
        order; ``job_groups`` gives each job its own (a key, or None for no
        group), sent as ``ADDJOBS ... GROUPS`` (a batch with a job without
        a group, or with ``job_headers`` too, as pipelined ADDJOBs).
        When OpenTelemetry is set up, each job gets its own creation context
        in its headers (docs/TRACING.md).
        """
        otel = tracing.telemetry()
        if otel is None:
            return self._add_jobs(queue, bodies, return_exceptions, batch_size,
                                  job_headers, job_groups, options)
        bodies = list(bodies)
        if job_headers is not None:
            job_headers = list(job_headers)
            if len(job_headers) != len(bodies):
                raise ValueError("job_headers needs one entry per body")
        if job_groups is not None:
            job_groups = list(job_groups)
            if len(job_groups) != len(bodies):
                raise ValueError("job_groups needs one entry per body")
        with otel.send_batch(queue, len(bodies), options.get("headers"), job_headers,
                             self.address) as send:
            ids: list[Any] = []
            try:
                for start in range(0, len(bodies), max(batch_size, 1)):
                    end = start + batch_size
                    results = self._add_traced_batch(
                        queue, bodies[start:end], batch_size,
                        None if send.job_headers is None else send.job_headers[start:end],
                        None if job_headers is None else job_headers[start:end],
                        None if job_groups is None else job_groups[start:end], options)
                    ids.extend(results)
                    if not return_exceptions:
                        for result in results:
                            if isinstance(result, DisqueError):
                                raise result
            finally:
                send.sent(ids, self.address)
        return ids

    def _add_traced_batch(self, queue: Arg, bodies: list[Arg], batch_size: int,
                          traced: list[Any] | None, own: list[Any] | None,
                          groups: list[Any] | None,
                          options: dict[str, Any]) -> list[Any]:
        """One batch of a traced :meth:`add_jobs`: with each job's creation
        context, or the jobs a node refused for their headers again without it."""
        if traced is None or self._node_id in self._no_headers:
            return self._add_jobs(queue, bodies, True, batch_size, own, groups, options)
        results = self._add_jobs(queue, bodies, True, batch_size, traced, groups, options)
        refused = [i for i, result in enumerate(results)
                   if isinstance(result, ResponseError) and w.headers_refused(result)]
        if refused:
            self._no_headers.add(self._node_id)  # an original node, or a low limit
            again = self._add_jobs(queue, [bodies[i] for i in refused], True, batch_size,
                                   None if own is None else [own[i] for i in refused],
                                   None if groups is None else [groups[i] for i in refused],
                                   options)
            for i, result in zip(refused, again, strict=True):
                results[i] = result
        return results

    def _add_jobs(self, queue: Arg, bodies: Iterable[Arg], return_exceptions: bool,
                  batch_size: int, job_headers: Iterable[Headers | None] | None,
                  job_groups: Iterable[Arg | None] | None,
                  options: dict[str, Any]) -> list[Any]:
        out: list[Any] = []
        items: Iterable[Any]
        build: Callable[[Any], w.Request]
        bulk: Callable[[Sequence[Any]], w.Request | None] | None
        if job_groups is not None:
            if job_headers is not None:
                items = zip(bodies, job_headers, job_groups, strict=True)
            else:
                items = ((body, None, group)
                         for body, group in zip(bodies, job_groups, strict=True))
            build = w.add_job_with_group_builder(queue, **options)
            bulk = w.add_jobs_with_groups_builder(queue, **options)
        elif job_headers is None:
            items = bodies
            build = w.add_job_builder(queue, **options)
            bulk = w.add_jobs_builder(queue, **options)
        else:
            items = zip(bodies, job_headers, strict=True)
            build = w.add_job_with_headers_builder(queue, **options)
            bulk = w.add_jobs_with_headers_builder(queue, **options)
        size = min(batch_size, w.MAX_BULK_BODIES) if bulk is not None else batch_size
        shared_key = None if self._groups is None else options.get("group")
        per_job = self._groups is not None and job_groups is not None
        for chunk in chunks(items, size):
            if shared_key is not None:
                results = self._add_chunk_in_groups(chunk, [shared_key] * len(chunk),
                                                    bulk, build)
            elif per_job:
                results = self._add_chunk_in_groups(chunk, [item[2] for item in chunk],
                                                    bulk, build)
            else:
                results = self._add_chunk(chunk, bulk, build)
            out.extend(results)
            if not return_exceptions:
                for result in results:
                    if isinstance(result, DisqueError):
                        raise result
        return out

    def _add_chunk(self, chunk: list[Any],
                   bulk: Callable[[Sequence[Any]], w.Request | None] | None,
                   build: Callable[[Any], w.Request]) -> list[Any]:
        """One ADDJOBS for ``chunk`` where the node has it (and the chunk
        fits one), else pipelined ADDJOBs."""
        request = bulk(chunk) if bulk is not None else None
        if request is not None and self._node_id not in self._no_bulk_add:
            try:
                results: list[Any] = self._execute(request)
                return results
            except DisqueError as err:
                if not w.is_unknown_command(err):
                    return [err] * len(chunk)  # each ADDJOB would have got it
                self._no_bulk_add.add(self._node_id)
        return self._execute_many([build(body) for body in chunk])

    # ---------------------------------------------- routing by group key

    def _execute_in_group(self, group: Arg | None, req: Request) -> Any:
        """Run one ADDJOB at its group's home (see ``route_groups``); on the
        connected node without a group or without group routing."""
        if group is None or self._groups is None:
            return self._execute(req)
        results = self._add_chunk_in_groups([req], [group], None, _same_request)
        return w.raise_if_error(results[0])

    def _add_chunk_in_groups(self, chunk: list[Any], keys: list[Arg | None],
                             bulk: Callable[[Sequence[Any]], w.Request | None] | None,
                             build: Callable[[Any], w.Request]) -> list[Any]:
        """:meth:`_add_chunk` for jobs of ordered groups: each job at its
        group's home (``keys[i]``: the group of ``chunk[i]``, None for none),
        the jobs of one home in one ADDJOBS where it has it.

        A home that cannot be reached, leaves, loses the link before
        answering or refuses groups is skipped for a while (for good if it
        refused: an original node), and its jobs go to the next node of
        their own ranking: the jobs of one group keep their order.  Jobs
        without a group, or whose ranking has no usable node left, go to
        the connected node as without groups.
        """
        assert self._groups is not None
        if self._conn is None:  # the node table comes with the first HELLO
            with self._lock:
                self._connection()
        encoded = [None if key is None else w.encode_arg(key) for key in keys]
        results: list[Any] = [None] * len(chunk)
        pending = list(range(len(chunk)))
        while pending:
            parts: dict[str | None, list[int]] = {}
            home_of: dict[bytes, str | None] = {}  # each key ranked once
            for i in pending:
                key = encoded[i]
                home: str | None = None
                if key is not None:
                    if key not in home_of:
                        homes = self._groups.homes(key)
                        home_of[key] = homes[0] if homes else None
                    home = home_of[key]
                parts.setdefault(home, []).append(i)
            pending = []
            for node_id, at in parts.items():
                items = [chunk[i] for i in at]
                if node_id is None:
                    for i, result in zip(at, self._add_chunk(items, bulk, build),
                                         strict=True):
                        results[i] = result
                    continue
                request = (bulk(items) if bulk is not None and node_id not in self._no_bulk_add
                           else None)
                reqs = [request] if request is not None else [build(item) for item in items]
                out: list[Any] = [None] * len(reqs)
                with self._lock:
                    again = self._send_to_home(node_id, reqs, out)
                if request is None:
                    for k, i in enumerate(at):
                        if k in again:
                            pending.append(i)
                        else:
                            results[i] = out[k]
                elif again:
                    pending += at  # the whole ADDJOBS, at the next nodes
                elif isinstance(out[0], DisqueError):
                    if w.is_unknown_command(out[0]):
                        self._no_bulk_add.add(node_id)  # ADDJOBs next round, same home
                        pending += at
                    else:
                        for i in at:
                            results[i] = out[0]  # each ADDJOB would have got it
                else:
                    for i, job_id in zip(at, out[0], strict=True):
                        results[i] = job_id
            pending.sort()
        return results

    def _send_to_home(self, node_id: str, reqs: list[Request],
                      results: list[Any]) -> set[int]:
        """Pipeline ``reqs`` to ``node_id`` (call with the lock held), storing
        each result; return the indexes it did not answer for good: all of
        them if it cannot be reached, those after a lost link, those
        answered ``-LEAVING`` and, from a node that does not know GROUP (a
        syntax error: an original node), the refused ones.  The node is
        then skipped by :class:`GroupRouter` (the last for good)."""
        assert self._groups is not None
        main = node_id == self._node_id
        conn = self._conn if main else self._route_connection(node_id)
        everything = list(range(len(reqs)))
        if conn is None:
            self._groups.failed(node_id)
            return set(everything)
        replies: list[Any] = []
        try:
            conn.send_packed_command([w.pack_commands([r.args for r in reqs])])
            for r in reqs:
                replies.append(self._read(conn, r.wait))
        except LINK_ERRORS as exc:
            log.info("group routing: lost %s (%s); the next node by rank", node_id[:8], exc)
            self._groups.failed(node_id)
            if main:
                self._drop()
            else:
                self._route_failed(node_id)
            return set(w.unanswered(reqs, everything, replies, results))
        except BaseException:
            if main:
                self._drop()  # replies pending: the connection is unusable
            else:
                self._close_route(node_id)
            raise
        again = set(w.sort_replies(reqs, everything, replies, results))
        if again:  # -LEAVING
            self._table.mark_leaving(node_id)
            self._groups.failed(node_id)
            if main:
                self._drop()
            else:
                self._route_failed(node_id)
        refused = {i for i in everything if w.group_refused(results[i])}
        if refused:
            log.info("group routing: %s does not know GROUP (an original node); skipped",
                     node_id[:8])
            self._groups.refused(node_id)
        return again | refused

    def get_jobs(self, *queues: Arg, count: int = 1, timeout_ms: int | None = None,
                 nohang: bool = False, with_counters: bool = False,
                 with_lease: bool = False, with_headers: bool = False,
                 with_group: bool = False) -> list[Job]:
        """GETJOB: up to ``count`` jobs from the first queues that have some.

        Blocks until a job arrives, or ``timeout_ms`` (``None``/0 = forever)
        passes (then ``[]``); ``nohang`` never blocks.  ``with_counters``
        fills :attr:`Job.nacks` and :attr:`Job.additional_deliveries`;
        ``with_lease`` (``WITHLEASE``, this server's extension: an original
        node answers ``-ERR syntax error``) :attr:`Job.requeue_within_ms`;
        ``with_headers`` (``WITHHEADERS``, likewise an extension)
        :attr:`Job.headers`; ``with_group`` (``WITHGROUP``, likewise)
        :attr:`Job.group`.  Without them the reply is the original's.  When
        OpenTelemetry traces, the client asks for
        the headers anyway (to link the receive span to each job's creation
        context) and keeps the context in :attr:`Job.trace_context`;
        :attr:`Job.headers` stays None unless asked for.
        """
        return self._get_jobs(queues, count, timeout_ms, nohang, with_counters,
                              with_lease, with_headers, with_group, True)

    def _get_jobs(self, queues: Sequence[Arg], count: int, timeout_ms: int | None,
                  nohang: bool, with_counters: bool, with_lease: bool,
                  with_headers: bool, with_group: bool, batch: bool) -> list[Job]:
        otel = tracing.telemetry()
        jobs: list[Job]
        if otel is None:
            jobs = self._execute(w.get_jobs(queues, count, timeout_ms, nohang,
                                            with_counters, with_lease, with_headers,
                                            with_group))
        else:
            make = functools.partial(w.get_jobs, queues, count, timeout_ms, nohang,
                                     with_counters, with_lease, with_group=with_group)
            jobs = self._get_jobs_traced(otel, queues, with_headers, batch, make)
        target = self._affinity_target(jobs)
        if target is not None:
            self._switch_to(target)
        return jobs

    def _get_jobs_traced(self, otel: tracing.Telemetry, queues: Sequence[Arg],
                         with_headers: bool, batch: bool,
                         make: Callable[[bool], Request]) -> list[Job]:
        """GETJOB under a ``receive`` span, linked to the jobs' creation contexts."""
        with otel.receive(queues, batch) as receive:
            extra = (not with_headers and otel.tracing
                     and self._node_id not in self._no_headers)
            jobs: list[Job]
            if not extra:
                jobs = self._execute(make(with_headers))
            else:
                try:
                    jobs = self._execute(make(True))
                except ResponseError as err:
                    if not w.headers_refused(err):
                        raise
                    self._no_headers.add(self._node_id)  # an original node
                    jobs = self._execute(make(False))
                jobs = [dataclasses.replace(job, headers=None,
                                            trace_context=otel.keep_context(job))
                        if job.headers is not None else job for job in jobs]
            receive.received(jobs, self.address)
        return jobs

    def get_job(self, *queues: Arg, timeout_ms: int | None = None, nohang: bool = False,
                with_counters: bool = False, with_lease: bool = False,
                with_headers: bool = False, with_group: bool = False) -> Job | None:
        """One job (see :meth:`get_jobs`), or None on timeout / NOHANG."""
        jobs = self._get_jobs(queues, 1, timeout_ms, nohang, with_counters, with_lease,
                              with_headers, with_group, False)
        return jobs[0] if jobs else None

    def process(self, *jobs: Job,
                parent_from_job: bool = False) -> AbstractContextManager[Any]:
        """A context manager around the application's handling of ``jobs``:
        the ``process {queue}`` span (CONSUMER) of the messaging conventions
        when OpenTelemetry traces, a no-op otherwise (docs/TRACING.md).

        ``with client.process(job): handle(job)``.  The span's parent is the
        ambient context; it links to each job's creation context.  With
        ``parent_from_job=True`` and one job, the job's creation context is
        the parent instead (the producer's trace goes on), and the ambient
        context, if any, a link.  It yields the span (None without tracing);
        an exception leaving the block marks the span as failed.
        """
        if not jobs:
            raise ValueError("process needs at least one job")
        otel = tracing.telemetry()
        if otel is None:
            return contextlib.nullcontext()
        return otel.process(jobs, parent_from_job, self.address)

    def _switch_to(self, node_id: str) -> None:
        """Affinity: move to ``node_id`` if it answers; stay put otherwise."""
        address = self._table.address_of(node_id)
        if address is None:
            return
        with self._lock:
            try:
                conn, hello = self._open(address)
            except SWITCH_ERRORS as exc:
                log.info("affinity: could not move to %s: %s", format_address(address), exc)
                return
            log.info("affinity: moving to %s (node %s)", format_address(address), node_id)
            self._adopt(address, conn, hello)

    def _ids(self, name: str, job_ids: tuple[Arg, ...],
             tail: tuple[Arg, ...] = ()) -> int:
        if not job_ids:
            return 0
        if name not in ROUTED_BY_JOB_ID:
            return self._execute(w.job_ids_command(name, job_ids, tail))
        self._learn_cluster()
        total = 0
        otel = tracing.telemetry()
        for node, at in self._route(job_ids).items():
            req = w.job_ids_command(name, [job_ids[i] for i in at], tail)
            if otel is None:
                total += self._execute_routed(node, req)
                continue
            with otel.settle(SETTLE_NAMES[name], [job_ids[i] for i in at],
                             self._address_of(node)) as settle:
                total += self._execute_routed(node, req)
                settle.at(self._address_of(node))
        return total

    def ack(self, *job_ids: Arg) -> int:
        """ACKJOB: acknowledge jobs; returns how many were known and newly acked."""
        return self._ids("ACKJOB", job_ids)

    def fastack(self, *job_ids: Arg) -> int:
        """FASTACK: best-effort delete everywhere; returns jobs known and deleted."""
        return self._ids("FASTACK", job_ids)

    def nack(self, *job_ids: Arg, delay: int | None = None) -> int:
        """NACK: put jobs back in the queue, counting a failed attempt: now,
        after the job's BACKOFF, or ``delay`` seconds from now (``NACK ...
        DELAY``, an extension of this server)."""
        return self._ids("NACK", job_ids, w.nack_tail(delay))

    def enqueue(self, *job_ids: Arg) -> int:
        """ENQUEUE: queue jobs that are not queued; returns how many were."""
        return self._ids("ENQUEUE", job_ids)

    def dequeue(self, *job_ids: Arg) -> int:
        """DEQUEUE: take queued jobs out of their queue; returns how many."""
        return self._ids("DEQUEUE", job_ids)

    def del_job(self, *job_ids: Arg) -> int:
        """DELJOB: delete jobs from this node only; returns how many existed."""
        return self._ids("DELJOB", job_ids)

    def _ids_many(self, name: str, job_ids: Iterable[Arg], batch_size: int) -> int:
        self._learn_cluster()
        total = 0
        otel = tracing.telemetry()
        for batch in chunks(job_ids, batch_size * PIPELINE_COMMANDS):
            for node, at in self._route(batch).items():
                ids = [batch[i] for i in at]
                reqs = [w.job_ids_command(name, group) for group in chunks(ids, batch_size)]
                settle = (contextlib.nullcontext() if otel is None else
                          otel.settle(SETTLE_NAMES[name], ids, self._address_of(node)))
                with settle:
                    for result in self._execute_many_routed(node, reqs):
                        if isinstance(result, DisqueError):
                            raise result
                        total += result
        return total

    def ack_many(self, job_ids: Iterable[Arg], *,
                 batch_size: int = DEFAULTS["batch_size"]) -> int:
        """ACKJOB for any number of IDs: ``batch_size`` IDs per command, pipelined.

        Returns the sum of the replies.  A BADID error rejects only the
        command holding the bad ID; it is raised after its pipeline ran.
        """
        return self._ids_many("ACKJOB", job_ids, batch_size)

    def fastack_many(self, job_ids: Iterable[Arg], *,
                     batch_size: int = DEFAULTS["batch_size"]) -> int:
        """FASTACK for any number of IDs, like :meth:`ack_many`."""
        return self._ids_many("FASTACK", job_ids, batch_size)

    def wait_job(self, job_id: Arg, timeout_ms: int = 0) -> bool:
        """WAITJOB (extension): wait until the job is acknowledged.

        True once acked (also if it was acked before the call), False when
        ``timeout_ms`` passes first (0 waits forever); ``NoJob`` if the node
        does not know the job or it went away without an ACK (expired,
        deleted).  Asked of the job's creator, which holds a copy and learns
        of an ACK made anywhere in the cluster.
        """
        self._learn_cluster()
        node = self._route_one(job_id)
        try:
            return self._execute_routed(node, w.wait_job(job_id, timeout_ms))
        except NoJob as err:
            if node is None or not str(err).startswith(NOJOB_UNKNOWN):
                raise
            # Its creator has no copy (replicated externally): ask ours.
            return self._execute(w.wait_job(job_id, timeout_ms))

    def working(self, job_id: Arg) -> int:
        """WORKING: postpone redelivery; returns the seconds it was postponed by."""
        self._learn_cluster()
        node = self._route_one(job_id)
        try:
            return self._execute_routed(node, w.working(job_id))
        except NoJob:
            if node is None:
                raise
            # Its creator has no copy (replicated externally): ask ours.
            return self._execute(w.working(job_id))

    def working_many(self, job_ids: Iterable[Arg]) -> list[int | DisqueError]:
        """WORKING for each ID: per ID the seconds or the error.

        One WORKINGS per thousand IDs (this server's extension), pipelined
        WORKINGs on a node without it (the original). Errors (``NoJob``,
        ``TooLate``, ``Acked`` ...) are returned in place, not raised, so
        one lost job does not hide the others' answers.

        Each ID goes to the node named in it (see ``route_by_job_id``). A
        ``NoJob`` in place is that node's answer: a node that is not the
        job's own holds no copy of a job replicated elsewhere, so its NOJOB
        says nothing.  When such a node answered (the job's node was not
        known, or did not answer), the client asks the job's node (after a
        HELLO, if the table does not know it), and when that node cannot be
        asked (down, leaving), the other nodes, one of which may hold a copy
        (its answer then stands).  When no node answers for the job, the
        ID's answer is a ``ConnectionFailed`` in place.  (An ID naming a
        node no HELLO lists keeps the NOJOB of the node that answered.)
        """
        self._learn_cluster()
        out: list[int | DisqueError] = []
        for batch in chunks(job_ids, PIPELINE_COMMANDS * 32):
            results: list[Any] = [None] * len(batch)
            answered: list[str | None] = [None] * len(batch)
            self._working_routed(batch, range(len(batch)), results, answered)
            doubtful = [i for i, result in enumerate(results)
                        if isinstance(result, NoJob) and not answered_by_own_node(
                            batch[i], answered[i])]
            if doubtful and self._router is not None:
                self._working_own_node(batch, doubtful, results, answered)
            out.extend(results)
        return out

    def _working_routed(self, batch: list[Arg], indexes: Iterable[int],
                        results: list[Any], answered: list[str | None]) -> None:
        """WORKING for ``batch[i]`` of each index, grouped by the node to send
        it to; each reply and the node that gave it stored at ``i``."""
        indexes = list(indexes)
        for node, at in self._route([batch[i] for i in indexes]).items():
            group = [indexes[k] for k in at]
            by: list[str | None] = []
            replies = self._working_group(node, [batch[i] for i in group], by)
            for i, result, node_id in zip(group, replies, by, strict=True):
                results[i] = result
                answered[i] = node_id

    def _working_own_node(self, batch: list[Arg], doubtful: list[int],
                          results: list[Any], answered: list[str | None]) -> None:
        """NOJOB from a node that is not the job's own: ask the job's node."""
        if any(self._table.node_by_prefix(str(job_node_prefix(batch[i]))) is None
               for i in doubtful):
            # A node that joined after our last HELLO: ask the table again.
            try:
                self.hello()
            except DisqueError as exc:
                log.info("job routing: HELLO to refresh the node table failed: %s", exc)
        routable = [i for i in doubtful if self._route_one(batch[i]) is not None]
        if routable:
            self._working_routed(batch, routable, results, answered)
        # The job's node could not be asked (down, leaving): a copy may be on
        # another node, whose WORKING keeps the lease there.
        unasked = [i for i in doubtful if isinstance(results[i], NoJob)
                   and not answered_by_own_node(batch[i], answered[i])]
        for node in list(self._table.nodes.values()):
            if not unasked:
                break
            if (self._table.priority(node.id) >= LEAVING_PRIORITY
                    or self._table.address_of(node.id) is None):
                continue
            # Not the node that said NOJOB already, nor the job's own (down).
            ask = [i for i in unasked if answered[i] != node.id
                   and not answered_by_own_node(batch[i], node.id)]
            if not ask:
                continue
            replies = self._working_group(node.id, [batch[i] for i in ask], [])
            for i, reply in zip(ask, replies, strict=True):
                if not isinstance(reply, NoJob):
                    results[i] = reply  # that node holds a copy: its answer is the job's
                    answered[i] = node.id
            unasked = [i for i in unasked if isinstance(results[i], NoJob)]
        for i in doubtful:
            prefix, by = job_node_prefix(batch[i]), answered[i]
            if (isinstance(results[i], NoJob) and not answered_by_own_node(batch[i], by)
                    and self._table.node_by_prefix(str(prefix)) is not None):
                # A node of the cluster that could not be asked (failing,
                # leaving, unreachable). A node the cluster does not know
                # (forgotten, or no node's ID) leaves the NOJOB as it is.
                where = by[:8] if by else "the connected node"
                results[i] = ConnectionFailed(
                    f"WORKING {batch[i]!r}: its node {prefix} could not be asked "
                    f"(failing, leaving or unreachable), and {where} holds no copy", {})

    def _working_group(self, node: str | None, ids: list[Arg],
                       answered: list[str | None]) -> list[Any]:
        """WORKINGS by the thousand where the node has it, else one WORKING per
        ID; ``answered`` gets the ID of the node that answered each ID."""
        key = self._node_id if node is None else node
        if key not in self._no_bulk_working:
            reqs = [w.workings(group) for group in chunks(ids, w.WORKINGS_IDS)]
            by: list[str | None] = []
            replies = self._execute_many_routed(node, reqs, by)
            if not any(isinstance(r, DisqueError) for r in replies):
                answered[:] = [node_id for reply, node_id in zip(replies, by, strict=True)
                               for _ in reply]
                return [result for reply in replies for result in reply]
            if any(w.is_unknown_command(r) for r in replies):
                self._no_bulk_working.add(key)
            # Else a whole-command error (-BADID): one WORKING per ID tells
            # which ID it concerns, as without the extension.
        return self._execute_many_routed(node, w.working_requests(ids), answered)

    def show(self, job_id: Arg) -> dict[str, Any] | None:
        """SHOW: the job's fields as a dict (``body`` stays bytes), or None.

        Asked of the job's creator first; of the connected node when the
        creator has no copy (replicated externally, or already deleted).
        """
        self._learn_cluster()
        node = self._route_one(job_id)
        shown = self._execute_routed(node, w.show(job_id))
        if shown is None and node is not None:
            shown = self._execute(w.show(job_id))
        return shown

    # -------------------------------------------------------------- queues

    def qlen(self, queue: Arg) -> int:
        """QLEN: jobs queued in this node's queue."""
        return self._execute(w.qlen(queue))

    def qstat(self, queue: Arg) -> dict[str, Any] | None:
        """QSTAT: the queue's statistics as a dict, or None if it does not exist."""
        return self._execute(w.qstat(queue))

    def qpeek(self, queue: Arg, count: int) -> list[Job]:
        """QPEEK: the ``count`` oldest jobs (newest first if ``count`` < 0)."""
        return self._execute(w.qpeek(queue, count))

    def pause(self, queue: Arg, *options: str, bcast: bool = False) -> str:
        """PAUSE queue in|out|all|none|state: returns the resulting state.

        Without options it only reads the state; ``bcast`` sends the same
        PAUSE to every reachable node.
        """
        return self._execute(w.pause(queue, options, bcast))

    def qlimit(self, queue: Arg, max_jobs: int | None = None,
               period_ms: int | None = None, *, off: bool = False,
               bcast: bool = False) -> tuple[int, int] | None:
        """QLIMIT (an extension): the queue's rate limit as ``(max_jobs,
        period_ms)``, or None.

        With ``max_jobs`` and ``period_ms`` the node delivers at most that
        many of the queue's jobs per period (GETJOB; consumers wait for the
        next window); ``off=True`` lifts it.  The limit is per node:
        ``bcast`` sets the same on every node of this server (not on
        original nodes, which have no rate limits).
        """
        return self._execute(w.qlimit(queue, max_jobs, period_ms, off, bcast))

    def _scan(self, make: Callable[[int], Request]) -> Iterator[Any]:
        """Follow a QSCAN/JSCAN cursor to 0.

        The cursor only means something on the node that issued it: if the
        client moved to another node in between, the scan restarts there
        (SCAN semantics already allow duplicates).
        """
        cursor, node = 0, None
        while True:
            with self._lock:
                if cursor and self._node_id != node:
                    cursor = 0
                self._connection()
                node = self._node_id
                cursor, items = self._execute_locked(make(cursor))
                if self._node_id != node:
                    cursor, node = 0, self._node_id
                    continue
            for item in items:
                yield item
            if cursor == 0:
                return

    def qscan(self, *, count: int | None = None, busyloop: bool = False,
              minlen: int | None = None, maxlen: int | None = None,
              importrate: int | None = None,
              min_priority: int | None = None) -> Iterator[str]:
        """Iterate queue names with QSCAN (all pages; options as in Disque;
        ``min_priority``, an extension: queues holding a queued job of that
        priority or higher)."""
        return self._scan(lambda c: w.qscan_page(c, count, busyloop, minlen, maxlen, importrate,
                                                 min_priority))

    @overload
    def jscan(self, *, count: int | None = ..., busyloop: bool = ..., queue: Arg | None = ...,
              states: Iterable[str] = ..., reply: Literal["id"] = ...,
              min_priority: int | None = ..., group: Arg | None = ...) -> Iterator[str]: ...

    @overload
    def jscan(self, *, count: int | None = ..., busyloop: bool = ..., queue: Arg | None = ...,
              states: Iterable[str] = ..., reply: Literal["all"],
              min_priority: int | None = ...,
              group: Arg | None = ...) -> Iterator[dict[str, Any]]: ...

    def jscan(self, *, count: int | None = None, busyloop: bool = False,
              queue: Arg | None = None, states: Iterable[str] = (),
              reply: str = "id", min_priority: int | None = None,
              group: Arg | None = None) -> Iterator[Any]:
        """Iterate jobs with JSCAN: IDs, or SHOW-like dicts with ``reply="all"``.

        ``states`` filters by job state (``queued``, ``active``, ...; OR-ed);
        ``min_priority`` (an extension) keeps jobs of that priority or higher,
        ``group`` (an extension) the jobs of that ordered group.
        """
        states = tuple(states)
        return self._scan(lambda c: w.jscan_page(c, count, busyloop, queue, states, reply,
                                                 min_priority, group))

    # -------------------------------------------------------------- server

    def hello(self) -> Hello:
        """HELLO: the node table (also refreshes the client's copy)."""
        with self._lock:
            hello: Hello = self._execute_locked(w.hello())
            if self._address is not None:
                self._table.learn(self._address, hello)
                self._hello = hello
            return hello

    def ping(self, message: Arg | None = None) -> bytes:
        """PING: ``b"PONG"``, or ``message`` echoed."""
        return self._execute(w.ping(message))

    def info(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """INFO as ``{"server": {"tcp_port": 7711, ...}, "jobs": {...}, ...}``."""
        return self._execute(w.info(section))

    def cluster_meet(self, host: str, port: int) -> None:
        """CLUSTER MEET: ask the node to join the cluster of ``host:port``."""
        self._execute(w.cluster_meet(host, port))

    def cluster_leaving(self, leaving: bool | None = None) -> bool:
        """CLUSTER LEAVING [yes|no]: set, or read, the node's leaving state."""
        return self._execute(w.cluster_leaving(leaving))

    def cluster_myid(self) -> str:
        """CLUSTER MYID: this node's ID."""
        return self._execute(w.cluster_myid())

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """CLUSTER NODES, one dict per node (id, host, port, flags, ...)."""
        return self._execute(w.cluster_nodes())

    def cluster_info(self) -> dict[str, Any]:
        """CLUSTER INFO fields."""
        return self._execute(w.cluster_info())

    def cluster_forget(self, node_id: str) -> None:
        """CLUSTER FORGET: drop a node from this node's table."""
        self._execute(w.cluster_forget(node_id))

    def cluster_reset(self, hard: bool = False) -> None:
        """CLUSTER RESET [HARD]: forget all peers and drop all jobs of this node."""
        self._execute(w.cluster_reset(hard))

    def config_get(self, pattern: str) -> dict[str, str]:
        """CONFIG GET pattern."""
        return self._execute(w.config_get(pattern))

    def config_set(self, name: str, value: Arg) -> None:
        """CONFIG SET name value."""
        self._execute(w.config_set(name, value))
