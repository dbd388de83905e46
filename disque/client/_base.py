"""Settings, node bookkeeping and constants common to :class:`Client` and :class:`AsyncClient`."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis.exceptions

from ..exceptions import DisqueError, ProtocolError, ResponseError
from ._cluster import (
    Address,
    Affinity,
    GroupRouter,
    JobRouter,
    NodeTable,
    format_address,
    parse_addresses,
)
from ._wire import Job, NodeInfo

__all__ = [
    "ClientBase", "DEFAULTS", "NETWORK_ERRORS", "CONNECT_ERRORS", "SWITCH_ERRORS",
    "LINK_ERRORS", "ROUTED_BY_JOB_ID", "PIPELINE_COMMANDS", "chunks",
]

#: Documented defaults (see the Client docstring and docs/CLIENT.md).
DEFAULTS: dict[str, Any] = {
    "socket_timeout": 30.0,
    "connect_timeout": 2.0,
    "max_retries": 3,
    "reconnect_timeout": 10.0,
    "retry_backoff": 0.05,
    "retry_backoff_max": 1.0,
    "affinity_window": 200,
    "affinity_threshold": 0.6,
    "batch_size": 1000,
}

#: Errors that mean "this connection is gone": retry elsewhere.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
)
#: Errors of one connect attempt that make the client try the next node.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    *NETWORK_ERRORS, ResponseError, ProtocolError, redis.exceptions.RedisError)
#: Errors that make a switch of node (affinity, routing) give up and stay put.
SWITCH_ERRORS: tuple[type[BaseException], ...] = (
    *NETWORK_ERRORS, DisqueError, redis.exceptions.RedisError)
#: Errors on an open connection that make it unusable.
LINK_ERRORS: tuple[type[BaseException], ...] = (*NETWORK_ERRORS, redis.exceptions.RedisError)
#: Multi-ID commands sent to the node named in each job ID (SHOW and WORKING
#: are routed too); ENQUEUE, DEQUEUE and DELJOB act on the connected node only,
#: as their documentation says, so they stay there.
ROUTED_BY_JOB_ID = frozenset({"ACKJOB", "FASTACK", "NACK"})
#: Commands per round trip in ack_many & co (each carries up to batch_size IDs).
PIPELINE_COMMANDS = 32


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Lists of at most ``size`` items, lazily (works on generators)."""
    if size < 1:
        raise ValueError("batch_size must be >= 1")
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class ClientBase:
    """Constructor parameters and node bookkeeping (no I/O here)."""

    def __init__(
        self,
        addresses: str | tuple[str, int] | Iterable[str | tuple[str, int]] = "127.0.0.1:7711",
        *,
        password: str | None = None,
        username: str | None = None,
        socket_timeout: float | None = DEFAULTS["socket_timeout"],
        connect_timeout: float | None = DEFAULTS["connect_timeout"],
        max_retries: int = DEFAULTS["max_retries"],
        reconnect_timeout: float = DEFAULTS["reconnect_timeout"],
        retry_backoff: float = DEFAULTS["retry_backoff"],
        retry_backoff_max: float = DEFAULTS["retry_backoff_max"],
        randomize: bool = True,
        affinity: bool = False,
        affinity_window: int = DEFAULTS["affinity_window"],
        affinity_threshold: float = DEFAULTS["affinity_threshold"],
        route_by_job_id: bool = True,
        route_groups: bool = True,
        client_name: str | None = None,
        connection_kwargs: Mapping[str, Any] | None = None,
        rng: random.Random | None = None,
        tls: bool = False,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_check_hostname: bool = True,
        tls_verify: bool = True,
    ) -> None:
        if max_retries < 0 or reconnect_timeout < 0 or retry_backoff < 0:
            raise ValueError("max_retries, reconnect_timeout and retry_backoff must be >= 0")
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (a client certificate "
                             "and its key)")
        #: TLS (a node's tls-port): on when asked, or when any TLS file is given.
        self.tls = bool(tls or tls_ca_file or tls_cert_file)
        #: redis-py's SSLConnection options (the same names sync and asyncio).
        self._tls_options: dict[str, Any] = {
            "ssl_ca_certs": tls_ca_file, "ssl_certfile": tls_cert_file,
            "ssl_keyfile": tls_key_file, "ssl_cert_reqs": "required" if tls_verify else "none",
            "ssl_check_hostname": tls_check_hostname and tls_verify,
        } if self.tls else {}
        if username is not None and password is None:
            raise ValueError("username needs a password (AUTH username password)")
        self.password = password
        #: The user (ACL, an extension) AUTH names; None: the default user.
        self.username = username
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self.reconnect_timeout = reconnect_timeout
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = max(retry_backoff, retry_backoff_max)
        self.client_name = client_name
        self.connection_kwargs = dict(connection_kwargs or {})
        # HELLO lists the nodes' plain ports: over TLS only the addresses
        # given here (TLS ports) are dialled; HELLO still gives the priorities.
        self._table = NodeTable(parse_addresses(addresses), randomize, rng,
                                seeds_only=self.tls)
        self._affinity = Affinity(affinity_window, affinity_threshold) if affinity else None
        self._router = JobRouter(self._table) if route_by_job_id else None
        #: Where the ADDJOBs of an ordered group go (None: the connected node).
        self._groups = GroupRouter(self._table) if route_groups else None
        self._address: Address | None = None
        self._node_id: str | None = None
        #: Address to try last at the next connect (it just failed or left).
        self._avoid: Address | None = None
        #: Nodes (IDs) that answered ADDJOBS with "unknown command": original
        #: nodes, which get pipelined ADDJOBs instead.
        self._no_bulk_add: set[str | None] = set()
        #: The same for WORKINGS (working_many sends one WORKING per ID there).
        self._no_bulk_working: set[str | None] = set()
        #: Nodes that refused job headers (an original node, or one whose
        #: max-job-headers is 0): tracing sends and asks for none there.
        self._no_headers: set[str | None] = set()
        self._init_connection_state()

    def _init_connection_state(self) -> None:
        """Subclasses set up their connection and lock here (keeps one signature)."""

    # ----------------------------------------------------------------- state

    @property
    def seeds(self) -> list[str]:
        """The addresses this client was given, as ``host:port``."""
        return [format_address(a) for a in self._table.seeds]

    @property
    def address(self) -> str | None:
        """``host:port`` of the node currently connected, or None."""
        return format_address(self._address) if self._address else None

    @property
    def node_id(self) -> str | None:
        """ID of the node currently connected (from its HELLO), or None."""
        return self._node_id

    @property
    def nodes(self) -> list[NodeInfo]:
        """Every node learned from HELLO replies, with priorities as last seen."""
        table = self._table
        return [NodeInfo(n.id, n.host, n.port, table.priority(n.id))
                for n in table.nodes.values()]

    def _reconnect_delays(self) -> Iterator[float]:
        """Backoff pauses between rounds over all candidates (doubling, capped)."""
        delay = self.retry_backoff
        while True:
            yield delay
            delay = min(delay * 2, self.retry_backoff_max)

    def _read_timeout(self, wait: float | None) -> float | None:
        """Socket read timeout for a command the server may hold ``wait`` s."""
        if wait is None or self.socket_timeout is None:
            return None
        return self.socket_timeout + wait

    def _affinity_target(self, jobs: list[Job]) -> str | None:
        if self._affinity is None or not jobs:
            return None
        self._affinity.observe(job.id for job in jobs)
        target = self._affinity.pick(self._node_id, self._table)
        if target is not None:
            self._affinity.reset()
        return target

    def _route(self, job_ids: Sequence[Any]) -> dict[str | None, list[int]]:
        """Indexes of ``job_ids`` by the node to send them to (``None``: the
        connected node; see :class:`~disque.client._cluster.JobRouter`)."""
        if self._router is None or not job_ids:
            return {None: list(range(len(job_ids)))}
        return self._router.group(job_ids, self._node_id)

    def _route_one(self, job_id: Any) -> str | None:
        """The node to send a command about one job to (``None``: connected node)."""
        return None if self._router is None else self._router.target(job_id, self._node_id)

    def _address_of(self, node_id: str | None) -> str | None:
        """``host:port`` of ``node_id`` (None: the connected node)."""
        if node_id is not None:
            address = self._table.address_of(node_id)
            if address is not None:
                return format_address(address)
        return self.address

    def _describe_errors(self, errors: dict[str, BaseException]) -> str:
        return "; ".join(f"{addr}: {err}" for addr, err in errors.items()) or "no address"
