"""The asyncio Disque client: the same API as :class:`Client`, awaitable."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Literal, overload

import redis.asyncio
import redis.exceptions

from ..exceptions import (
    AuthError,
    ConnectionFailed,
    DisqueError,
    Leaving,
    NoJob,
    ProtocolError,
)
from . import _wire as w
from ._base import DEFAULTS, ClientBase
from ._cluster import Address, format_address
from ._wire import NOJOB_UNKNOWN, Arg, Hello, Job, Request
from .sync import (
    CONNECT_ERRORS,
    LINK_ERRORS,
    NETWORK_ERRORS,
    PIPELINE_COMMANDS,
    ROUTED_BY_JOB_ID,
    SWITCH_ERRORS,
    chunks,
)

__all__ = ["AsyncClient"]

log = logging.getLogger("disque.client")


class AsyncClient(ClientBase):
    """An asyncio, cluster-aware Disque client built on ``redis.asyncio``.

    Same parameters, behaviour and methods as :class:`disque.Client` (see
    its docstring), with ``await``: ``await client.add_job("q", b"x")``,
    ``async for name in client.qscan()``, ``async with AsyncClient(...)``.
    Commands from concurrent tasks are serialized on the one connection;
    give each consumer task its own client so blocking GETJOBs do not wait
    for one another.
    """

    def _init_connection_state(self) -> None:
        self._conn: redis.asyncio.Connection | None = None
        self._hello: Hello | None = None
        self._lock = asyncio.Lock()
        #: node ID -> connection for commands about the jobs it created.
        self._routes: dict[str, redis.asyncio.Connection] = {}

    # ---------------------------------------------------------- connection

    async def connect(self) -> Hello:
        """Connect now (if not connected) and return the node's HELLO."""
        async with self._lock:
            await self._connection()
            assert self._hello is not None
            return self._hello

    async def close(self) -> None:
        """Close the connection; the next command reconnects."""
        async with self._lock:
            conn, self._conn = self._conn, None
            self._address = self._node_id = None
            if conn is not None:
                await _disconnect(conn, wait=self.tls)
            for node_id in list(self._routes):
                await self._close_route(node_id)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        where = self.address or "not connected"
        return f"<disque.AsyncClient {where} seeds={','.join(self.seeds)}>"

    async def _connection(self) -> redis.asyncio.Connection:
        if self._conn is None:
            await self._connect_any()
        assert self._conn is not None
        return self._conn

    async def _connect_any(self) -> None:
        deadline = time.monotonic() + self.reconnect_timeout
        errors: dict[str, BaseException] = {}
        delays = self._reconnect_delays()
        while True:
            for address in self._table.candidates(self._avoid):
                try:
                    conn, hello = await self._open(address)
                except AuthError:
                    raise
                except CONNECT_ERRORS as exc:
                    errors[format_address(address)] = exc
                    continue
                await self._adopt(address, conn, hello)
                return
            # The last pause ends at the deadline, for one more round there:
            # a node that comes back just in time is found.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionFailed("no Disque node reachable: "
                                       + self._describe_errors(errors), errors)
            await asyncio.sleep(min(next(delays), remaining))

    async def _open(self, address: Address) -> tuple[redis.asyncio.Connection, Hello]:
        options = {**w.connection_options(asynchronous=True), **self._tls_options,
                   **self.connection_kwargs}
        connection_class = (redis.asyncio.SSLConnection if self.tls
                            else redis.asyncio.Connection)
        conn = connection_class(host=address[0], port=address[1],
                                socket_timeout=self.socket_timeout,
                                socket_connect_timeout=self.connect_timeout,
                                socket_keepalive=True, **options)
        try:
            await conn.connect()
            if self.password is not None:
                await self._roundtrip(conn, w.request("AUTH", self.password))
            if self.client_name:
                await self._roundtrip(conn, w.request("CLIENT", "SETNAME", self.client_name))
            hello = w.parse_hello(await self._roundtrip(conn, w.hello()))
        except BaseException:
            await _disconnect(conn)
            raise
        return conn, hello

    async def _adopt(self, address: Address, conn: redis.asyncio.Connection,
                     hello: Hello) -> None:
        old = self._conn
        self._table.learn(address, hello)
        self._conn, self._address, self._node_id, self._hello = conn, address, hello.node_id, hello
        self._avoid = None
        if old is not None and old is not conn:
            await _disconnect(old)
        log.debug("connected to %s (node %s)", format_address(address), hello.node_id)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if self._address is not None:
            self._avoid = self._address
        self._address = self._node_id = None
        if conn is not None:
            await _disconnect(conn)

    async def _read(self, conn: redis.asyncio.Connection, wait: float | None) -> Any:
        timeout = self._read_timeout(wait)
        if timeout is None:
            return await conn.read_response(timeout=math.inf)
        try:
            async with asyncio.timeout(timeout):
                return await conn.read_response(timeout=math.inf)
        except TimeoutError as exc:
            raise redis.exceptions.TimeoutError("Timeout reading from socket") from exc

    async def _roundtrip(self, conn: redis.asyncio.Connection, req: Request) -> Any:
        await conn.send_command(*req.args)
        return w.raise_if_error(await self._read(conn, req.wait))

    # ------------------------------------------------------------ execution

    async def _execute(self, req: Request) -> Any:
        async with self._lock:
            return await self._execute_locked(req)

    async def _execute_locked(self, req: Request) -> Any:
        attempt = 0
        while True:
            conn = await self._connection()
            address = self.address or "?"
            try:
                reply = await self._roundtrip(conn, req)
            except Leaving:
                self._table.mark_leaving(self._node_id)
                await self._drop()
                if attempt >= self.max_retries:
                    raise
            except DisqueError:
                raise
            except NETWORK_ERRORS as exc:
                await self._drop()
                if attempt >= self.max_retries:
                    raise ConnectionFailed(f"connection to {address} lost: {exc}",
                                           {address: exc}) from exc
            except redis.exceptions.InvalidResponse as exc:
                await self._drop()
                raise ProtocolError(str(exc)) from exc
            except BaseException:
                await self._drop()  # cancelled mid-read: a reply is pending
                raise
            else:
                return req.parse(reply)
            attempt += 1
            log.info("retrying %s on another node (attempt %d)",
                     req.args[0].decode(errors="replace"), attempt)

    async def _execute_many(self, reqs: list[Request]) -> list[Any]:
        """Pipelined requests; see :meth:`Client._execute_many`."""
        results: list[Any] = [None] * len(reqs)
        pending = list(range(len(reqs)))
        attempt = 0
        async with self._lock:
            while pending:
                conn = await self._connection()
                address = self.address or "?"
                replies: list[Any] = []
                try:
                    await conn.send_packed_command(
                        [w.pack_commands([reqs[i].args for i in pending])])
                    for i in pending:
                        replies.append(await self._read(conn, reqs[i].wait))
                except NETWORK_ERRORS as exc:
                    await self._drop()
                    pending = w.unanswered(reqs, pending, replies, results)
                    if attempt >= self.max_retries:
                        raise ConnectionFailed(f"connection to {address} lost: {exc}",
                                               {address: exc}) from exc
                    attempt += 1
                    continue
                except BaseException:
                    await self._drop()
                    raise
                again = w.sort_replies(reqs, pending, replies, results)
                if again:
                    self._table.mark_leaving(self._node_id)
                    await self._drop()
                    if attempt >= self.max_retries:
                        break
                    attempt += 1
                pending = again
        return results

    # ------------------------------------------------- routing by job ID

    async def _route_connection(self, node_id: str) -> redis.asyncio.Connection | None:
        """See :meth:`Client._route_connection` (call with the lock held)."""
        conn = self._routes.get(node_id)
        if conn is not None:
            return conn
        address = self._table.address_of(node_id)
        if address is None:
            return None
        try:
            conn, hello = await self._open(address)
        except SWITCH_ERRORS as exc:
            log.info("job routing: %s unreachable (%s); using the connected node",
                     format_address(address), exc)
            await self._route_failed(node_id)
            return None
        if hello.node_id != node_id:  # another node answers there now
            await _disconnect(conn)
            await self._route_failed(node_id)
            return None
        self._table.learn(address, hello)
        self._routes[node_id] = conn
        return conn

    async def _close_route(self, node_id: str) -> None:
        conn = self._routes.pop(node_id, None)
        if conn is not None:
            await _disconnect(conn, wait=self.tls)

    async def _route_failed(self, node_id: str) -> None:
        await self._close_route(node_id)
        if self._router is not None:
            self._router.failed(node_id)

    async def _execute_routed(self, node_id: str | None, req: Request) -> Any:
        """See :meth:`Client._execute_routed`."""
        if node_id is not None:
            async with self._lock:
                conn = await self._route_connection(node_id)
                if conn is not None:
                    try:
                        return req.parse(await self._roundtrip(conn, req))
                    except Leaving:
                        self._table.mark_leaving(node_id)
                        await self._route_failed(node_id)
                    except DisqueError:
                        raise
                    except LINK_ERRORS as exc:
                        log.info("job routing: lost %s (%s); using the connected node",
                                 node_id[:8], exc)
                        await self._route_failed(node_id)
                    except BaseException:
                        await self._close_route(node_id)  # reply pending: unusable
                        raise
        return await self._execute(req)

    async def _execute_many_routed(self, node_id: str | None,
                                   reqs: list[Request]) -> list[Any]:
        """See :meth:`Client._execute_many_routed`."""
        if node_id is None:
            return await self._execute_many(reqs)
        results: list[Any] = [None] * len(reqs)
        again = list(range(len(reqs)))
        async with self._lock:
            conn = await self._route_connection(node_id)
            if conn is not None:
                replies: list[Any] = []
                try:
                    await conn.send_packed_command([w.pack_commands([r.args for r in reqs])])
                    for r in reqs:
                        replies.append(await self._read(conn, r.wait))
                except LINK_ERRORS as exc:
                    log.info("job routing: lost %s (%s); using the connected node",
                             node_id[:8], exc)
                    await self._route_failed(node_id)
                except BaseException:
                    await self._close_route(node_id)
                    raise
                again = w.unanswered(reqs, again, replies, results)
                if again and len(replies) == len(reqs):  # all answered: some -LEAVING
                    self._table.mark_leaving(node_id)
                    await self._route_failed(node_id)
        if again:  # not answered there: the connected node (outside the lock)
            for i, result in zip(again, await self._execute_many([reqs[i] for i in again]),
                                 strict=True):
                results[i] = result
        return results

    async def send_pipeline(self, build: Callable[[str | None], tuple[bytes, int]], *,
                            wait: float | None = 0.0) -> w.PipelineReplies:
        """See :meth:`Client.send_pipeline`."""
        async with self._lock:
            try:
                conn = await self._connection()
            except ConnectionFailed as exc:
                return w.PipelineReplies([], 0, exc)
            address, node_id = self.address or "?", self.node_id
            payload, count = build(node_id)
            replies: list[Any] = []
            try:
                await conn.send_packed_command([payload])
                for _ in range(count):
                    replies.append(await self._read(conn, wait))
            except NETWORK_ERRORS as exc:
                await self._drop()
                return w.PipelineReplies(replies, count, ConnectionFailed(
                    f"connection to {address} lost after {len(replies)} of {count} "
                    f"replies: {exc}", {address: exc}), node_id)
            except BaseException:
                await self._drop()
                raise
        return w.PipelineReplies(replies, count, None, node_id)

    async def drop_node(self, *, leaving: bool = False) -> None:
        """See :meth:`Client.drop_node`."""
        async with self._lock:
            if leaving:
                self._table.mark_leaving(self._node_id)
            await self._drop()

    async def execute_command(self, *args: Arg) -> Any:
        """Send any command and return the raw reply (errors raise)."""
        if not args:
            raise ValueError("execute_command needs a command name")
        return await self._execute(w.request(*args))

    # ---------------------------------------------------------------- jobs

    async def add_job(self, queue: Arg, body: Arg, *, timeout_ms: int = 0,
                      replicate: int | None = None, delay: int | None = None,
                      retry: int | None = None, ttl: int | None = None,
                      maxlen: int | None = None, async_: bool = False,
                      backoff: int | None = None, max_deliveries: int | None = None,
                      dead_letter: Arg | None = None, idmp: Arg | None = None,
                      idmp_window: int | None = None) -> str:
        """ADDJOB; see :meth:`Client.add_job`."""
        return await self._execute(w.add_job(queue, body, timeout_ms, replicate, delay, retry,
                                             ttl, maxlen, async_, backoff, max_deliveries,
                                             dead_letter, idmp, idmp_window))

    @overload
    async def add_jobs(self, queue: Arg, bodies: Iterable[Arg], *,
                       return_exceptions: Literal[False] = ..., batch_size: int = ...,
                       **options: Any) -> list[str]: ...

    @overload
    async def add_jobs(self, queue: Arg, bodies: Iterable[Arg], *,
                       return_exceptions: Literal[True], batch_size: int = ...,
                       **options: Any) -> list[str | DisqueError]: ...

    async def add_jobs(self, queue: Arg, bodies: Iterable[Arg], *,
                       return_exceptions: bool = False,
                       batch_size: int = DEFAULTS["batch_size"], **options: Any) -> list[Any]:
        """ADDJOBS, or pipelined ADDJOBs; see :meth:`Client.add_jobs`."""
        out: list[Any] = []
        build = w.add_job_builder(queue, **options)
        bulk = w.add_jobs_builder(queue, **options)
        size = min(batch_size, w.MAX_BULK_BODIES) if bulk is not None else batch_size
        for chunk in chunks(bodies, size):
            results = await self._add_chunk(chunk, bulk, build)
            out.extend(results)
            if not return_exceptions:
                for result in results:
                    if isinstance(result, DisqueError):
                        raise result
        return out

    async def _add_chunk(self, chunk: list[Arg],
                         bulk: Callable[[Sequence[Arg]], w.Request] | None,
                         build: Callable[[Arg], w.Request]) -> list[Any]:
        """One ADDJOBS for ``chunk`` where the node has it, else pipelined ADDJOBs."""
        if bulk is not None and self._node_id not in self._no_bulk_add:
            try:
                results: list[Any] = await self._execute(bulk(chunk))
                return results
            except DisqueError as err:
                if not w.is_unknown_command(err):
                    return [err] * len(chunk)  # each ADDJOB would have got it
                self._no_bulk_add.add(self._node_id)
        return await self._execute_many([build(body) for body in chunk])

    async def get_jobs(self, *queues: Arg, count: int = 1, timeout_ms: int | None = None,
                       nohang: bool = False, with_counters: bool = False,
                       with_lease: bool = False) -> list[Job]:
        """GETJOB; see :meth:`Client.get_jobs`."""
        jobs: list[Job] = await self._execute(w.get_jobs(queues, count, timeout_ms, nohang,
                                                         with_counters, with_lease))
        target = self._affinity_target(jobs)
        if target is not None:
            await self._switch_to(target)
        return jobs

    async def get_job(self, *queues: Arg, timeout_ms: int | None = None, nohang: bool = False,
                      with_counters: bool = False, with_lease: bool = False) -> Job | None:
        """One job, or None; see :meth:`Client.get_job`."""
        jobs = await self.get_jobs(*queues, timeout_ms=timeout_ms, nohang=nohang,
                                   with_counters=with_counters, with_lease=with_lease)
        return jobs[0] if jobs else None

    async def _switch_to(self, node_id: str) -> None:
        address = self._table.address_of(node_id)
        if address is None:
            return
        async with self._lock:
            try:
                conn, hello = await self._open(address)
            except SWITCH_ERRORS as exc:
                log.info("affinity: could not move to %s: %s", format_address(address), exc)
                return
            log.info("affinity: moving to %s (node %s)", format_address(address), node_id)
            await self._adopt(address, conn, hello)

    async def _ids(self, name: str, job_ids: tuple[Arg, ...],
                   tail: tuple[Arg, ...] = ()) -> int:
        if not job_ids:
            return 0
        if name not in ROUTED_BY_JOB_ID:
            return await self._execute(w.job_ids_command(name, job_ids, tail))
        total = 0
        for node, at in self._route(job_ids).items():
            total += await self._execute_routed(
                node, w.job_ids_command(name, [job_ids[i] for i in at], tail))
        return total

    async def ack(self, *job_ids: Arg) -> int:
        """ACKJOB; see :meth:`Client.ack`."""
        return await self._ids("ACKJOB", job_ids)

    async def fastack(self, *job_ids: Arg) -> int:
        """FASTACK; see :meth:`Client.fastack`."""
        return await self._ids("FASTACK", job_ids)

    async def nack(self, *job_ids: Arg, delay: int | None = None) -> int:
        """NACK; see :meth:`Client.nack`."""
        return await self._ids("NACK", job_ids, w.nack_tail(delay))

    async def enqueue(self, *job_ids: Arg) -> int:
        """ENQUEUE; see :meth:`Client.enqueue`."""
        return await self._ids("ENQUEUE", job_ids)

    async def dequeue(self, *job_ids: Arg) -> int:
        """DEQUEUE; see :meth:`Client.dequeue`."""
        return await self._ids("DEQUEUE", job_ids)

    async def del_job(self, *job_ids: Arg) -> int:
        """DELJOB; see :meth:`Client.del_job`."""
        return await self._ids("DELJOB", job_ids)

    async def _ids_many(self, name: str, job_ids: Iterable[Arg], batch_size: int) -> int:
        total = 0
        for batch in chunks(job_ids, batch_size * PIPELINE_COMMANDS):
            for node, at in self._route(batch).items():
                ids = [batch[i] for i in at]
                reqs = [w.job_ids_command(name, group) for group in chunks(ids, batch_size)]
                for result in await self._execute_many_routed(node, reqs):
                    if isinstance(result, DisqueError):
                        raise result
                    total += result
        return total

    async def ack_many(self, job_ids: Iterable[Arg], *,
                       batch_size: int = DEFAULTS["batch_size"]) -> int:
        """Batched ACKJOB; see :meth:`Client.ack_many`."""
        return await self._ids_many("ACKJOB", job_ids, batch_size)

    async def fastack_many(self, job_ids: Iterable[Arg], *,
                           batch_size: int = DEFAULTS["batch_size"]) -> int:
        """Batched FASTACK; see :meth:`Client.fastack_many`."""
        return await self._ids_many("FASTACK", job_ids, batch_size)

    async def wait_job(self, job_id: Arg, timeout_ms: int = 0) -> bool:
        """WAITJOB (extension); see :meth:`Client.wait_job`."""
        node = self._route_one(job_id)
        try:
            return await self._execute_routed(node, w.wait_job(job_id, timeout_ms))
        except NoJob as err:
            if node is None or not str(err).startswith(NOJOB_UNKNOWN):
                raise
            return await self._execute(w.wait_job(job_id, timeout_ms))

    async def working(self, job_id: Arg) -> int:
        """WORKING; see :meth:`Client.working`."""
        node = self._route_one(job_id)
        try:
            return await self._execute_routed(node, w.working(job_id))
        except NoJob:
            if node is None:
                raise
            return await self._execute(w.working(job_id))

    async def working_many(self, job_ids: Iterable[Arg]) -> list[int | DisqueError]:
        """Pipelined WORKING, errors in place; see :meth:`Client.working_many`."""
        out: list[int | DisqueError] = []
        for batch in chunks(job_ids, PIPELINE_COMMANDS * 32):
            results: list[Any] = [None] * len(batch)
            for node, at in self._route(batch).items():
                replies = await self._working_group(node, [batch[i] for i in at])
                for i, result in zip(at, replies, strict=True):
                    results[i] = result
            out.extend(results)
        return out

    async def _working_group(self, node: str | None, ids: list[Arg]) -> list[Any]:
        """WORKINGS by the thousand where the node has it, else one WORKING per ID."""
        key = self._node_id if node is None else node
        if key not in self._no_bulk_working:
            reqs = [w.workings(group) for group in chunks(ids, w.WORKINGS_IDS)]
            replies = await self._execute_many_routed(node, reqs)
            if not any(isinstance(r, DisqueError) for r in replies):
                return [result for reply in replies for result in reply]
            if any(w.is_unknown_command(r) for r in replies):
                self._no_bulk_working.add(key)
            # Else a whole-command error (-BADID): one WORKING per ID tells
            # which ID it concerns, as without the extension.
        return await self._execute_many_routed(node, w.working_requests(ids))

    async def show(self, job_id: Arg) -> dict[str, Any] | None:
        """SHOW; see :meth:`Client.show`."""
        node = self._route_one(job_id)
        shown = await self._execute_routed(node, w.show(job_id))
        if shown is None and node is not None:
            shown = await self._execute(w.show(job_id))
        return shown

    # -------------------------------------------------------------- queues

    async def qlen(self, queue: Arg) -> int:
        """QLEN; see :meth:`Client.qlen`."""
        return await self._execute(w.qlen(queue))

    async def qstat(self, queue: Arg) -> dict[str, Any] | None:
        """QSTAT; see :meth:`Client.qstat`."""
        return await self._execute(w.qstat(queue))

    async def qpeek(self, queue: Arg, count: int) -> list[Job]:
        """QPEEK; see :meth:`Client.qpeek`."""
        return await self._execute(w.qpeek(queue, count))

    async def pause(self, queue: Arg, *options: str, bcast: bool = False) -> str:
        """PAUSE; see :meth:`Client.pause`."""
        return await self._execute(w.pause(queue, options, bcast))

    async def _scan(self, make: Callable[[int], Request]) -> AsyncIterator[Any]:
        cursor, node = 0, None
        while True:
            async with self._lock:
                if cursor and self._node_id != node:
                    cursor = 0
                await self._connection()
                node = self._node_id
                cursor, items = await self._execute_locked(make(cursor))
                if self._node_id != node:
                    cursor, node = 0, self._node_id
                    continue
            for item in items:
                yield item
            if cursor == 0:
                return

    def qscan(self, *, count: int | None = None, busyloop: bool = False,
              minlen: int | None = None, maxlen: int | None = None,
              importrate: int | None = None) -> AsyncIterator[str]:
        """``async for name in client.qscan(...)``; see :meth:`Client.qscan`."""
        return self._scan(lambda c: w.qscan_page(c, count, busyloop, minlen, maxlen, importrate))

    def jscan(self, *, count: int | None = None, busyloop: bool = False,
              queue: Arg | None = None, states: Iterable[str] = (),
              reply: str = "id") -> AsyncIterator[Any]:
        """``async for job in client.jscan(...)``; see :meth:`Client.jscan`."""
        states = tuple(states)
        return self._scan(lambda c: w.jscan_page(c, count, busyloop, queue, states, reply))

    # -------------------------------------------------------------- server

    async def hello(self) -> Hello:
        """HELLO; see :meth:`Client.hello`."""
        async with self._lock:
            hello: Hello = await self._execute_locked(w.hello())
            if self._address is not None:
                self._table.learn(self._address, hello)
                self._hello = hello
            return hello

    async def ping(self, message: Arg | None = None) -> bytes:
        """PING; see :meth:`Client.ping`."""
        return await self._execute(w.ping(message))

    async def info(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """INFO; see :meth:`Client.info`."""
        return await self._execute(w.info(section))

    async def cluster_meet(self, host: str, port: int) -> None:
        """CLUSTER MEET; see :meth:`Client.cluster_meet`."""
        await self._execute(w.cluster_meet(host, port))

    async def cluster_leaving(self, leaving: bool | None = None) -> bool:
        """CLUSTER LEAVING; see :meth:`Client.cluster_leaving`."""
        return await self._execute(w.cluster_leaving(leaving))

    async def cluster_myid(self) -> str:
        """CLUSTER MYID."""
        return await self._execute(w.cluster_myid())

    async def cluster_nodes(self) -> list[dict[str, Any]]:
        """CLUSTER NODES; see :meth:`Client.cluster_nodes`."""
        return await self._execute(w.cluster_nodes())

    async def cluster_info(self) -> dict[str, Any]:
        """CLUSTER INFO fields."""
        return await self._execute(w.cluster_info())

    async def cluster_forget(self, node_id: str) -> None:
        """CLUSTER FORGET."""
        await self._execute(w.cluster_forget(node_id))

    async def cluster_reset(self, hard: bool = False) -> None:
        """CLUSTER RESET [HARD]."""
        await self._execute(w.cluster_reset(hard))

    async def config_get(self, pattern: str) -> dict[str, str]:
        """CONFIG GET."""
        return await self._execute(w.config_get(pattern))

    async def config_set(self, name: str, value: Arg) -> None:
        """CONFIG SET."""
        await self._execute(w.config_set(name, value))


async def _disconnect(conn: redis.asyncio.Connection, wait: bool = False) -> None:
    """Close ``conn``; ``wait`` for the transport to be closed (TLS: its
    shutdown runs on after close(), and a loop ending first leaks the socket)."""
    try:
        await conn.disconnect(nowait=not wait)
    except Exception:  # closing a broken connection: nothing more to do
        pass
