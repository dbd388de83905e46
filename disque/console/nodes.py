"""The cluster as one user sees it: a pinned client per node, found through HELLO.

Pages show figures *per node* (QSTAT, INFO and CLUSTER NODES are a node's
own view), so each node gets its own :class:`~disque.AsyncClient`, used
only while it is connected to that node: the client moves to another node
by itself when its node fails (that is what an application wants), which
would put another node's figures under this node's name.  A client that
lost its node is thrown away and the next call makes a new one, which knows
only its seed and so connects there or fails.

Every call goes through :meth:`Pool.each` or :meth:`Pool.on`, which turn
whatever a node does (an error reply, a refused connection, a reply of an
unexpected shape) into an :class:`Answer`: a page shows a down node or a
``-NOPERM`` in its row and never fails as a whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from disque.client import (
    AsyncClient,
    ConnectionFailed,
    DisqueError,
    Leaving,
    NoAuth,
    NoPerm,
    ResponseError,
    is_unknown_command,
    parse_address,
)

from .settings import Settings

__all__ = ["Credentials", "Node", "Problem", "Answer", "NodeLink", "Pool", "probe_open"]

log = logging.getLogger("disque.console")
T = TypeVar("T")


@dataclass(frozen=True)
class Credentials:
    """Who the console acts as on the nodes: a user and its password."""

    username: str | None = None
    password: str | None = None

    @property
    def user(self) -> str:
        """The user the nodes know this as: without a password the client
        sends no AUTH, so whatever the name says, the nodes see ``default``."""
        return self.username if self.username and self.password else "default"

    @property
    def key(self) -> tuple[str, str]:
        """Identifies a pool: sessions of the same user and password share one."""
        digest = hashlib.sha256((self.password or "").encode()).hexdigest()
        return self.user, digest


@dataclass(frozen=True)
class Node:
    """One node of the cluster: its address and, once it answered, its ID."""

    address: str
    id: str | None = None
    #: HELLO's priority as last seen (1 reachable ... 100 failing or leaving).
    priority: int = 1

    @property
    def short_id(self) -> str:
        return self.id[:8] if self.id else "?"


@dataclass(frozen=True)
class Problem:
    """Why a node gave no answer: ``down``, ``noperm``, ``unsupported`` or ``error``."""

    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class Answer(Generic[T]):
    """One node's answer to one call: a value, or the problem instead."""

    node: Node
    value: T | None = None
    problem: Problem | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def classify(exc: BaseException) -> Problem:
    """The :class:`Problem` a failed call shows (never raises)."""
    if isinstance(exc, NoPerm):
        return Problem("noperm", f"NOPERM {exc.message}" if exc.message else "NOPERM")
    if isinstance(exc, (ConnectionFailed, OSError, asyncio.TimeoutError, Leaving)):
        return Problem("down", f"not reachable: {exc}")
    if isinstance(exc, DisqueError) and is_unknown_command(exc):
        return Problem("unsupported", "this node does not have the command (an original node)")
    if isinstance(exc, ResponseError):
        return Problem("error", str(exc))
    return Problem("error", f"{type(exc).__name__}: {exc}")


class NodeLink:
    """Calls to one node as one user, on a client that never moves elsewhere."""

    def __init__(self, address: str, credentials: Credentials, settings: Settings) -> None:
        host, port = parse_address(address)
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.credentials = credentials
        self.settings = settings
        self._client: AsyncClient | None = None
        #: monotonic time before which the node is not tried again (it just failed).
        self._down_until = 0.0
        self._last_problem: str = ""

    def _new_client(self) -> AsyncClient:
        return AsyncClient(
            self.address, username=self.credentials.username if self.credentials.password
            else None, password=self.credentials.password,
            socket_timeout=self.settings.node_timeout, connect_timeout=2.0, max_retries=0,
            reconnect_timeout=0, randomize=False, route_by_job_id=False,
            client_name="disque-console", tls=self.settings.tls,
            tls_ca_file=self.settings.tls_ca_file, tls_cert_file=self.settings.tls_cert_file,
            tls_key_file=self.settings.tls_key_file, tls_verify=self.settings.tls_verify)

    async def run(self, call: Callable[[AsyncClient], Awaitable[T]]) -> T:
        """``call(client)`` on this node; raises what the client raises."""
        if time.monotonic() < self._down_until:
            raise ConnectionFailed(f"{self.address} {self._last_problem} (retried shortly)", {})
        client = self._client or self._new_client()
        self._client = client
        try:
            result = await call(client)
        except ResponseError as exc:
            if isinstance(exc, Leaving):
                await self._discard(str(exc))
            raise
        except BaseException as exc:
            await self._discard(str(exc))
            raise
        if client.address != self.address:
            # The client found another node (ours went away between two
            # calls): that answer is not this node's.
            await self._discard("connection moved to another node")
            raise ConnectionFailed(f"{self.address} not reachable", {})
        return result

    async def _discard(self, why: str) -> None:
        client, self._client = self._client, None
        self._down_until = time.monotonic() + self.settings.node_retry_seconds
        self._last_problem = why
        if client is not None:
            try:
                await client.close()
            except Exception:  # closing a broken connection: nothing left to do
                pass

    def forget_failure(self) -> None:
        """Try the node at the next call (a user asked again explicitly)."""
        self._down_until = 0.0

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


@dataclass
class Pool:
    """One user's view of the cluster: the nodes (HELLO) and a link to each."""

    seeds: tuple[str, ...]
    credentials: Credentials
    settings: Settings
    links: dict[str, NodeLink] = field(default_factory=dict)
    _nodes: list[Node] = field(default_factory=list)
    _nodes_at: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: address -> whether the node has this server's extensions (None: unknown yet).
    extensions: dict[str, bool] = field(default_factory=dict)
    #: address -> whether the node answers ``SHOW id NOBODY`` (None: unknown
    #: yet; see :mod:`disque.console.shows`).
    show_nobody: dict[str, bool] = field(default_factory=dict)

    def link(self, address: str) -> NodeLink:
        link = self.links.get(address)
        if link is None:
            link = self.links[address] = NodeLink(address, self.credentials, self.settings)
        return link

    async def nodes(self, max_age: float = 3.0) -> list[Node]:
        """Every node: the seeds and what HELLO lists, refreshed every few seconds."""
        async with self._lock:
            if self._nodes and time.monotonic() - self._nodes_at < max_age:
                return self._nodes
            self._nodes = await self._discover()
            self._nodes_at = time.monotonic()
            return self._nodes

    async def _discover(self) -> list[Node]:
        if self.settings.tls:
            return await self._seeds_only()
        known = [n.address for n in self._nodes]
        tried: list[str] = []
        for address in [*self.seeds, *known]:
            link = self.link(address)
            if link.address in tried:
                continue
            tried.append(link.address)
            try:
                hello = await link.run(lambda c: c.hello())
            except (DisqueError, OSError) as exc:
                if isinstance(exc, NoAuth):
                    raise
                continue
            found: dict[str, Node] = {}
            for info in hello.nodes:
                # An original node that never met another lists itself without
                # an address: the one we reached it through is it.
                addr = (link.address if info.id == hello.node_id or not info.host
                        else self.link(f"{info.host}:{info.port}").address)
                found[addr] = Node(addr, info.id, info.priority)
            for seed in self.seeds:
                # A seed this HELLO does not list (not joined, or down): its own
                # HELLO names it; if it gives none, it is shown as down.
                addr = self.link(seed).address
                if addr in found:
                    continue
                own = await self._own_entry(addr)
                found[addr] = own or Node(addr)
            return sorted(found.values(), key=lambda n: n.address)
        previous = {n.address: n for n in self._nodes}
        return [previous.get(a, Node(a)) for a in tried]

    async def _seeds_only(self) -> list[Node]:
        """Over TLS, the seeds, each named by its own HELLO: HELLO lists
        the nodes' plain ports, which a TLS connection cannot use, so the
        seeds must be every node's TLS address."""
        previous = {n.address: n for n in self._nodes}
        found: dict[str, Node] = {}
        for seed in self.seeds:
            link = self.link(seed)
            try:
                hello = await link.run(lambda c: c.hello())
            except (DisqueError, OSError) as exc:
                if isinstance(exc, NoAuth):
                    raise
                found[link.address] = previous.get(link.address, Node(link.address))
                continue
            priority = next((i.priority for i in hello.nodes if i.id == hello.node_id), 1)
            found[link.address] = Node(link.address, hello.node_id, priority)
        return sorted(found.values(), key=lambda n: n.address)

    async def _own_entry(self, address: str) -> Node | None:
        try:
            hello = await self.link(address).run(lambda c: c.hello())
        except (DisqueError, OSError):
            return None
        return Node(address, hello.node_id, 1)

    async def each(self, call: Callable[[AsyncClient], Awaitable[T]],
                   nodes: list[Node] | None = None) -> list[Answer[T]]:
        """``call`` on every node at once; one :class:`Answer` per node, in order."""
        targets = nodes if nodes is not None else await self.nodes()
        return list(await asyncio.gather(*(self.on(n, call) for n in targets)))

    async def on(self, node: Node, call: Callable[[AsyncClient], Awaitable[T]]) -> Answer[T]:
        """``call`` on one node, its failure turned into the answer's problem."""
        try:
            value = await self.link(node.address).run(call)
        except Exception as exc:  # any failure is shown with its node, never raised
            if not isinstance(exc, DisqueError | OSError | asyncio.TimeoutError):
                log.warning("unexpected error from %s: %r", node.address, exc)
            return Answer(node, problem=classify(exc))
        return Answer(node, value)

    async def close(self) -> None:
        for link in self.links.values():
            try:
                await link.close()
            except Exception:  # a broken connection at shutdown: nothing to do
                pass


async def probe_open(seeds: tuple[str, ...], settings: Settings) -> bool | None:
    """Whether the nodes let anybody in (no password): True, False, or None
    when no node answered."""
    for seed in seeds:
        link = NodeLink(seed, Credentials(), settings)
        try:
            await link.run(lambda c: c.ping())
            await link.run(lambda c: c.hello())
            return True
        except NoAuth:
            return False
        except (DisqueError, OSError):
            continue
        finally:
            await link.close()
    return None
