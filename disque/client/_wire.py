"""What goes on the wire, shared by :class:`Client` and :class:`AsyncClient`.

Each command is described once as a :class:`Request`: the encoded arguments,
how long the server may legitimately hold the reply, and how to turn the raw
RESP2 reply into Python values.  The sync and async clients only differ in
how they send a request, so all parsing lives here and is tested once.

Encoding rules (why): bodies are opaque bytes to Disque, so they go out and
come back as ``bytes`` and are never decoded.  Queue names, job IDs and
option values are text for the user; ``str`` is encoded as UTF-8 with
``surrogateescape``, and names coming back are decoded the same way, so any
queue name (even one that is not valid UTF-8) survives a round trip.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis.asyncio.connection as _async_connection
import redis.connection as _sync_connection

from ..exceptions import (
    ConnectionFailed,
    DisqueError,
    Leaving,
    ProtocolError,
    ResponseError,
    error_from_reply,
)

__all__ = [
    "Arg", "Job", "NodeInfo", "Hello", "Request", "encode_arg", "text",
    "SYNC_PARSER", "ASYNC_PARSER", "connection_options", "raise_if_error",
    "parse_info", "parse_hello", "DEFAULT_PORT", "MAX_BULK_BODIES", "PipelineReplies",
    "is_unknown_command", "Headers",
]

DEFAULT_PORT = 7711

#: What a command argument may be.
Arg = str | bytes | bytearray | memoryview | int

#: A job's headers as a client gives them (an extension, docs/EXTENSIONS.md):
#: a mapping of names to values, or (name, value) pairs (a name may repeat).
Headers = Mapping[str, Arg] | Iterable[tuple[Arg, Arg]]


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Job:
    """A job as GETJOB or QPEEK returned it.

    ``nacks`` and ``additional_deliveries`` are ``None`` unless the job was
    fetched with ``with_counters=True`` (the server only sends them then).
    ``requeue_within_ms`` (``with_lease=True``, an extension of this server)
    is how long the node waits before queueing the job again unless it is
    acknowledged or WORKING postpones it; ``None`` if it never will (RETRY 0)
    or was not asked for.  ``headers`` (``with_headers=True``, an extension
    of this server) maps each header's name to its value (bytes; of a name
    given twice, the last value); ``{}`` for a job without headers, ``None``
    when not asked for.  ``group`` (``with_group=True``, an extension of
    this server) is the job's group key (``ADDJOB ... GROUP``), ``None`` for
    a job without a group or when not asked for; ``group_position`` (with
    it) is the job's place in its group, its creation time (``ctime``, as
    SHOW has it): sorting a group's jobs by ``(group_position, id)`` gives
    the order the node hands them out in, the same on every delivery.
    ``trace_context`` is the
    job's creation context (``traceparent``, ``tracestate``: the propagator's
    headers, as text) when the client traces (docs/TRACING.md) and the user
    did not ask for the headers; :meth:`Client.process` reads it.
    """

    queue: str
    id: str
    body: bytes
    nacks: int | None = None
    additional_deliveries: int | None = None
    requeue_within_ms: int | None = None
    headers: dict[str, bytes] | None = None
    group: str | None = None
    group_position: int | None = None
    trace_context: dict[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def node_prefix(self) -> str:
        """The first 8 hex chars of the ID of the node that created the job."""
        return self.id[2:10]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One entry of the HELLO node table."""

    id: str
    host: str
    port: int
    priority: int

    @property
    def address(self) -> str:
        return format_address((self.host, self.port))


@dataclass(frozen=True, slots=True)
class Hello:
    """The HELLO handshake: format version, the answering node's ID, all nodes."""

    version: int
    node_id: str
    nodes: tuple[NodeInfo, ...]

    @property
    def myself(self) -> NodeInfo | None:
        for node in self.nodes:
            if node.id == self.node_id:
                return node
        return None


#: What a client that may skip the handshake records when HELLO is refused
#: before authentication: no node ID, no node table.
NO_HELLO = Hello(1, "", ())


def format_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --------------------------------------------------------------------------
# Encoding and the reply parsers
# --------------------------------------------------------------------------

def encode_arg(value: Arg) -> bytes:
    """One command argument as bytes (see the module docstring for why)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bool):
        raise TypeError("a bool is not a valid Disque argument")
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"cannot send {type(value).__name__} as a Disque argument")


def text(value: Any) -> str:
    """A name/ID from a reply as str (lossless, see the module docstring)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, int):
        return str(value)
    raise ProtocolError(f"expected a string, got {value!r}")


def integer(value: Any) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, bytes) and value.lstrip(b"-").isdigit():
        return int(value)
    raise ProtocolError(f"expected an integer, got {value!r}")


def raise_if_error(reply: Any) -> Any:
    if isinstance(reply, DisqueError):
        raise reply
    return reply


class _DisqueErrors:
    """Parser mixin: error replies become :mod:`disque.exceptions` values.

    redis-py strips known prefixes (``ERR``, ``OOM``, ``NOAUTH``...) from
    the text and picks Redis classes; Disque clients match the first word,
    so the parser keeps the whole text and builds our class instead.  The
    error is *returned*, not raised, which keeps the connection usable and
    lets a pipeline collect one result per command.
    """

    def parse_error(self, response: Any) -> DisqueError:  # type: ignore[override]
        if isinstance(response, bytes):
            response = response.decode("utf-8", "replace")
        return error_from_reply(str(response))


# redis-py's DefaultParser (its public name for the parser a connection uses:
# hiredis when installed, else its pure-Python one) with our error classes;
# the connections always speak RESP2 (connection_options).  DefaultParser is
# a variable holding that class, which mypy does not take as a base.
class SyncParser(_DisqueErrors, _sync_connection.DefaultParser):  # type: ignore[misc,valid-type]
    """The sync client's reply parser."""


class AsyncParser(_DisqueErrors, _async_connection.DefaultParser):  # type: ignore[misc,valid-type]
    """The asyncio client's reply parser."""


SYNC_PARSER: type = SyncParser
ASYNC_PARSER: type = AsyncParser


def _accepts(cls: type, name: str) -> bool:
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


# redis-py >= 7 sends CLIENT SETINFO on connect unless driver_info is None:
# one useless round trip (and an error on the original C Disque).
_SYNC_EXTRA = ({"driver_info": None}
               if _accepts(_sync_connection.AbstractConnection, "driver_info") else {})
_ASYNC_EXTRA = ({"driver_info": None}
                if _accepts(_async_connection.AbstractConnection, "driver_info") else {})


def connection_options(asynchronous: bool) -> dict[str, Any]:
    """redis-py Connection arguments every Disque connection uses.

    ``protocol=2`` always: the original Disque rejects ``HELLO 3`` and its
    bare ``HELLO`` is the Disque handshake.  No redis-py level retries: the
    client decides where to retry (maybe on another node).
    """
    if asynchronous:
        from redis.asyncio.retry import Retry as AsyncRetry
        from redis.backoff import NoBackoff
        return {"protocol": 2, "parser_class": ASYNC_PARSER,
                "retry": AsyncRetry(NoBackoff(), 0), **_ASYNC_EXTRA}
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    return {"protocol": 2, "parser_class": SYNC_PARSER, "retry": Retry(NoBackoff(), 0),
            **_SYNC_EXTRA}


# --------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------

class Request(NamedTuple):
    """One command.

    ``wait`` is how long (seconds) the server may hold the reply on purpose:
    0 for ordinary commands, the GETJOB/ADDJOB timeout for blocking ones,
    ``None`` when it may block forever.  The client adds its socket timeout
    on top, so a blocking command is never cut short by the socket timeout.
    """

    args: tuple[bytes, ...]
    parse: Callable[[Any], Any]
    wait: float | None = 0.0


def request(*args: Arg, parse: Callable[[Any], Any] = lambda r: r,
            wait: float | None = 0.0) -> Request:
    return Request(tuple(encode_arg(a) for a in args), parse, wait)


def _kv(reply: Any, raw_keys: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """A flat key/value array as a dict; text values decoded except ``raw_keys``."""
    if reply is None:
        return None
    if not isinstance(reply, list) or len(reply) % 2:
        raise ProtocolError(f"expected a key/value array, got {reply!r}")
    out: dict[str, Any] = {}
    for key, value in zip(reply[::2], reply[1::2], strict=True):
        name = text(key)
        if name in raw_keys:
            out[name] = value
        elif isinstance(value, bytes):
            out[name] = text(value)
        elif isinstance(value, list):
            out[name] = [text(v) if isinstance(v, bytes) else v for v in value]
        else:
            out[name] = value
    return out


def parse_show(reply: Any) -> dict[str, Any] | None:
    shown = _kv(reply, frozenset({"body", "headers"}))
    if shown is not None and "headers" in shown:
        shown["headers"] = parse_headers(shown["headers"])
    return shown


def parse_headers(reply: Any) -> dict[str, bytes]:
    """A job's headers as the node sends them (name, value, ...): names
    decoded as text, values kept as bytes."""
    if not isinstance(reply, list) or len(reply) % 2:
        raise ProtocolError(f"expected the headers' name/value array, got {reply!r}")
    return {text(name): value if isinstance(value, bytes) else encode_arg(value)
            for name, value in zip(reply[::2], reply[1::2], strict=True)}


def header_items(headers: Headers) -> list[tuple[bytes, bytes]]:
    """The (name, value) pairs of ``headers``, encoded."""
    items: Iterable[tuple[Arg, Arg]] = (headers.items() if isinstance(headers, Mapping)
                                        else headers)
    return [(encode_arg(name), encode_arg(value)) for name, value in items]


def header_args(headers: Headers) -> list[Arg]:
    """``HEADER name value`` per header (ADDJOB's extension option)."""
    out: list[Arg] = []
    for name, value in header_items(headers):
        out += [b"HEADER", name, value]
    return out


def parse_job(entry: Any) -> Job:
    if not isinstance(entry, list) or len(entry) < 3:
        raise ProtocolError(f"expected a job entry [queue, id, body, ...], got {entry!r}")
    body = entry[2]
    if not isinstance(body, bytes):
        raise ProtocolError(f"expected a job body, got {body!r}")
    if len(entry) == 3:  # without counters: the usual case, and the hot one
        return Job(text(entry[0]), text(entry[1]), body)
    fields = entry[3:]
    group = position = None
    if len(fields) >= 2 and fields[-2] in (b"group", "group"):  # WITHGROUP: the last
        group = None if fields[-1] is None else text(fields[-1])
        fields = fields[:-2]
        if len(fields) >= 2 and fields[-2] in (b"group-position", "group-position"):
            position = None if fields[-1] is None else integer(fields[-1])
            fields = fields[:-2]
    headers = None
    if len(fields) >= 2 and fields[-2] in (b"headers", "headers"):  # WITHHEADERS: before it
        headers = parse_headers(fields[-1])
        fields = fields[:-2]
    counters = _kv(fields) or {}
    nacks = counters.get("nacks")
    extra = counters.get("additional-deliveries")
    lease = counters.get("next-requeue-within")
    return Job(text(entry[0]), text(entry[1]), body,
               None if nacks is None else integer(nacks),
               None if extra is None else integer(extra),
               None if lease is None else integer(lease), headers, group, position)


def parse_jobs(reply: Any) -> list[Job]:
    if reply is None:
        return []
    if not isinstance(reply, list):
        raise ProtocolError(f"expected an array of jobs, got {reply!r}")
    return [parse_job(entry) for entry in reply]


def parse_hello(reply: Any) -> Hello:
    if (not isinstance(reply, list) or len(reply) < 2 or not isinstance(reply[0], int)
            or not all(isinstance(n, list) and len(n) >= 4 for n in reply[2:])):
        raise ProtocolError(f"not a Disque HELLO reply: {reply!r}")
    nodes = tuple(NodeInfo(text(n[0]), text(n[1]), integer(n[2]), integer(n[3]))
                  for n in reply[2:])
    return Hello(reply[0], text(reply[1]), nodes)


def _number(value: str) -> int | float | str:
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def parse_info(reply: Any) -> dict[str, dict[str, int | float | str]]:
    """INFO text as ``{section: {field: value}}``; numbers become int/float.

    Section names are lowercased (``"# Server"`` -> ``"server"``), the form
    ``INFO <section>`` takes.  Fields before any header go to ``""``.
    """
    if isinstance(reply, bytes):
        reply = reply.decode("utf-8", "replace")
    if not isinstance(reply, str):
        raise ProtocolError(f"expected INFO text, got {reply!r}")
    sections: dict[str, dict[str, int | float | str]] = {}
    current = ""
    for line in reply.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            current = line[1:].strip().lower()
            sections.setdefault(current, {})
            continue
        key, sep, value = line.partition(":")
        if sep:
            sections.setdefault(current, {})[key] = _number(value)
    return sections


def _ok(reply: Any) -> None:
    if reply != b"OK":
        raise ProtocolError(f"expected OK, got {reply!r}")


def _int(reply: Any) -> int:
    return integer(reply)


def _text_list(reply: Any) -> list[str]:
    if not isinstance(reply, list):
        raise ProtocolError(f"expected an array, got {reply!r}")
    return [text(x) for x in reply]


def _scan_page(parse_item: Callable[[Any], Any]) -> Callable[[Any], tuple[int, list[Any]]]:
    def parse(reply: Any) -> tuple[int, list[Any]]:
        if not isinstance(reply, list) or len(reply) != 2 or not isinstance(reply[1], list):
            raise ProtocolError(f"expected [cursor, items], got {reply!r}")
        return integer(reply[0]), [parse_item(item) for item in reply[1]]
    return parse


def _seconds(ms: int | None) -> float | None:
    return None if not ms else ms / 1000.0


def sort_replies(reqs: list[Request], pending: list[int], replies: list[Any],
                 results: list[Any]) -> list[int]:
    """Store the replies of one pipeline round; return the requests to re-send.

    ``pending`` are the indexes (in ``reqs``) that were sent and ``replies``
    their raw replies in order.  Each result is the parsed reply, or the
    error (a :class:`DisqueError`, or the :class:`ProtocolError` of a reply
    that did not parse).  Requests answered ``-LEAVING`` are returned, to be
    sent again on another node; their result is the error until then.  The
    same rules for the sync and the async client: only the I/O differs.
    """
    again: list[int] = []
    for i, reply in zip(pending, replies, strict=True):
        if isinstance(reply, DisqueError):
            results[i] = reply
            if isinstance(reply, Leaving):
                again.append(i)
        else:
            try:
                results[i] = reqs[i].parse(reply)
            except ProtocolError as exc:
                results[i] = exc
    return again


def unanswered(reqs: list[Request], pending: list[int], replies: list[Any],
               results: list[Any]) -> list[int]:
    """A pipeline round cut short by a lost connection: store the replies read
    before the loss (the first ``len(replies)`` of ``pending``) and return what
    must be sent again: the requests never answered, and those answered
    ``-LEAVING``, in their original order."""
    answered = pending[:len(replies)]
    again = sort_replies(reqs, answered, replies, results)
    return sorted(again + pending[len(replies):])


def pack_commands(commands: list[tuple[bytes, ...]]) -> bytes:
    """Commands in RESP, ready to send as one pipeline.

    One ``%``-format per argument and one join: about twice as fast as
    redis-py's general-purpose packer, which the hot paths (``add_jobs``,
    ``ack_many``) would otherwise spend a third of their time in.
    """
    return b"".join([b"*%d\r\n%s" % (len(args), b"".join([b"$%d\r\n%s\r\n" % (len(a), a)
                                                          for a in args]))
                     for args in commands])


# One builder per command.  Each validates what the server could not
# report well (or at all) and returns a Request.

#: ADDJOB ... PRIORITY runs from 0 (the default) to this (an extension).
MAX_PRIORITY = 31

def add_job(queue: Arg, body: Arg, timeout_ms: int = 0, replicate: int | None = None,
            delay: int | None = None, retry: int | None = None, ttl: int | None = None,
            maxlen: int | None = None, async_: bool = False, backoff: int | None = None,
            max_deliveries: int | None = None, dead_letter: Arg | None = None,
            idmp: Arg | None = None, idmp_window: int | None = None,
            priority: int | None = None, headers: Headers | None = None,
            group: Arg | None = None) -> Request:
    args: list[Arg] = ["ADDJOB", queue, body, int(timeout_ms)]
    if priority is not None and not 0 <= int(priority) <= MAX_PRIORITY:
        raise ValueError(f"priority must be between 0 and {MAX_PRIORITY}, got {priority}")
    for name, value in (("REPLICATE", replicate), ("DELAY", delay), ("RETRY", retry),
                        ("TTL", ttl), ("MAXLEN", maxlen), ("BACKOFF", backoff),
                        ("MAXDELIVERIES", max_deliveries), ("PRIORITY", priority)):
        if value is not None:
            args += [name, int(value)]
    if dead_letter is not None:
        args += ["DEADLETTER", dead_letter]
    if async_:
        args.append("ASYNC")
    if idmp is not None:  # the extension: sent only when used
        args += ["IDMP", idmp]
        if idmp_window is not None:
            args += ["IDMP-WINDOW", int(idmp_window)]
    elif idmp_window is not None:
        raise ValueError("idmp_window needs idmp (an IDMP key)")
    if headers:  # the extension: sent only when used
        args += header_args(headers)
    if group is not None:  # the extension: sent only when used
        args += group_args(group)
    # Without ASYNC the node may hold the reply until the job is replicated:
    # up to timeout_ms, forever when it is 0.
    wait = 0.0 if async_ else _seconds(timeout_ms)
    return request(*args, parse=text, wait=wait)


def add_job_builder(queue: Arg, **options: Any) -> Callable[[Arg], Request]:
    """ADDJOB requests for many bodies with the same queue and options.

    The options are checked and encoded once (``add_jobs`` sends thousands of
    jobs per call); each body then costs one tuple.
    """
    template = add_job(queue, b"", **options)
    head, tail = template.args[:2], template.args[3:]
    parse, wait = template.parse, template.wait

    def build(body: Arg) -> Request:
        return Request((*head, encode_arg(body), *tail), parse, wait)

    return build


def add_job_with_headers_builder(queue: Arg,
                                 **options: Any) -> Callable[[tuple[Arg, Headers | None]],
                                                             Request]:
    """ADDJOB requests for (body, headers) pairs with the same queue and options."""
    template = add_job(queue, b"", **options)
    head, tail = template.args[:2], template.args[3:]
    parse, wait = template.parse, template.wait

    def build(job: tuple[Arg, Headers | None]) -> Request:
        body, headers = job
        extra = [encode_arg(a) for a in header_args(headers)] if headers else []
        return Request((*head, encode_arg(body), *tail, *extra), parse, wait)

    return build


def group_args(group: Arg) -> list[Arg]:
    """``GROUP key`` (ADDJOB's extension option): the key must not be empty."""
    if not encode_arg(group):
        raise ValueError("a group key must not be empty")
    return [b"GROUP", group]


#: One job of ``add_jobs(..., job_groups=...)``: its body, its own headers
#: (or None) and its group (or None).
GroupedJob = tuple[Arg, Headers | None, Arg | None]


def add_job_with_group_builder(queue: Arg, **options: Any) -> Callable[[GroupedJob], Request]:
    """ADDJOB requests for (body, headers, group) triples with the same
    queue and options."""
    template = add_job(queue, b"", **options)
    head, tail = template.args[:2], template.args[3:]
    parse, wait = template.parse, template.wait

    def build(job: GroupedJob) -> Request:
        body, headers, group = job
        extra = [encode_arg(a) for a in header_args(headers)] if headers else []
        if group is not None:
            extra += [encode_arg(a) for a in group_args(group)]
        return Request((*head, encode_arg(body), *tail, *extra), parse, wait)

    return build


#: Bodies per ADDJOBS (the node's own limit, disque.commands.bulk.MAX_BODIES).
MAX_BULK_BODIES = 10_000


@dataclass(frozen=True, slots=True)
class PipelineReplies:
    """What one pipeline sent with ``send_pipeline`` got back.

    ``replies`` are the raw replies read, in order (error replies as
    :class:`DisqueError` values, nothing parsed); ``sent`` is how many
    requests went out (0: no node could be reached, nothing was sent);
    ``error`` is what cut the rest off (None: every request was answered).
    A request without a reply may or may not have run on the node.
    """

    replies: list[Any]
    sent: int
    error: ConnectionFailed | None = None
    #: The node the pipeline went to (None when nothing was sent).
    node_id: str | None = None

    @property
    def unanswered(self) -> int:
        return self.sent - len(self.replies)


def add_jobs_builder(queue: Arg, **options: Any) -> Callable[[Sequence[Arg]], Request] | None:
    """ADDJOBS requests (the bulk ADDJOB of this server, docs/EXTENSIONS.md)
    for chunks of bodies with the same queue and options; None when the
    options cannot be shared by many jobs (an IDMP key names one job)."""
    if options.get("idmp") is not None:
        return None
    template = add_job(queue, b"", **options)
    head = (b"ADDJOBS", template.args[1], *template.args[3:], b"BODIES")
    wait = template.wait

    def build(bodies: Sequence[Arg]) -> Request:
        return Request((*head, *map(encode_arg, bodies)), _bulk_ids, wait)

    return build


def add_jobs_with_headers_builder(
        queue: Arg, **options: Any) -> Callable[[Sequence[tuple[Arg, Headers | None]]],
                                                Request] | None:
    """``ADDJOBS ... JOBS`` requests for chunks of (body, headers) pairs:
    per job its header count, names and values, then its body."""
    if options.get("idmp") is not None:
        return None
    template = add_job(queue, b"", **options)
    head = (b"ADDJOBS", template.args[1], *template.args[3:], b"JOBS")
    wait = template.wait

    def build(jobs: Sequence[tuple[Arg, Headers | None]]) -> Request:
        args: list[bytes] = list(head)
        for body, headers in jobs:
            items = header_items(headers) if headers else []
            args.append(b"%d" % len(items))
            for name, value in items:
                args.append(name)
                args.append(value)
            args.append(encode_arg(body))
        return Request(tuple(args), _bulk_ids, wait)

    return build


def add_jobs_with_groups_builder(
        queue: Arg, **options: Any) -> Callable[[Sequence[GroupedJob]], Request | None] | None:
    """``ADDJOBS ... GROUPS`` requests for chunks of (body, headers, group)
    triples: per job its group, then its body.  A chunk it cannot carry (a
    job with its own headers, or without a group) gets None: the caller
    sends its jobs as ADDJOBs."""
    if options.get("idmp") is not None:
        return None
    if options.get("group") is not None:
        raise ValueError("give either group (every job) or job_groups (one per job)")
    template = add_job(queue, b"", **options)
    head = (b"ADDJOBS", template.args[1], *template.args[3:], b"GROUPS")
    wait = template.wait

    def build(jobs: Sequence[GroupedJob]) -> Request | None:
        args: list[bytes] = list(head)
        for body, headers, group in jobs:
            if headers or group is None:
                return None
            key = encode_arg(group)
            if not key:
                raise ValueError("a group key must not be empty")
            args.append(key)
            args.append(encode_arg(body))
        return Request(tuple(args), _bulk_ids, wait)

    return build


def _bulk_ids(reply: Any) -> list[Any]:
    """ADDJOBS' array: an ID (str) or the error of that body, in order."""
    if not isinstance(reply, list):
        raise ProtocolError(f"expected an array, got {reply!r}")
    return [r if isinstance(r, DisqueError) else text(r) for r in reply]


def is_unknown_command(error: BaseException) -> bool:
    """The node does not have the command (an original node, for ADDJOBS)."""
    return isinstance(error, DisqueError) and str(error).startswith("ERR unknown command")


def group_refused(result: Any) -> bool:
    """An ADDJOB's result says the node does not know GROUP: an original
    node's bare syntax error (ours names what is wrong with a group)."""
    return isinstance(result, ResponseError) and str(result) == "ERR syntax error"


def headers_refused(error: BaseException) -> bool:
    """The node refused a job's headers or WITHHEADERS: an original node (a
    syntax error), or ours with ``max-job-headers`` too low."""
    message = str(error)
    return (message.startswith("ERR syntax error") or message.startswith("ERR too many headers")
            or message.startswith("ERR headers too large"))


def get_jobs(queues: Sequence[Arg], count: int = 1, timeout_ms: int | None = None,
             nohang: bool = False, with_counters: bool = False,
             with_lease: bool = False, with_headers: bool = False,
             with_group: bool = False) -> Request:
    if not queues:
        raise ValueError("get_jobs needs at least one queue")
    args: list[Arg] = ["GETJOB"]
    if nohang:
        args.append("NOHANG")
    if timeout_ms is not None:
        args += ["TIMEOUT", int(timeout_ms)]
    if count != 1:
        args += ["COUNT", int(count)]
    if with_counters:
        args.append("WITHCOUNTERS")
    if with_lease:
        args.append("WITHLEASE")
    if with_headers:
        args.append("WITHHEADERS")
    if with_group:
        args.append("WITHGROUP")
    args += ["FROM", *queues]
    wait = 0.0 if nohang else _seconds(timeout_ms)
    return request(*args, parse=parse_jobs, wait=wait)


def job_ids_command(name: str, ids: Iterable[Arg], tail: Sequence[Arg] = ()) -> Request:
    """``name id ... [tail]``: ``tail`` is NACK's ``DELAY s``."""
    return request(name, *ids, *tail, parse=_int)


def nack_tail(delay: int | None) -> tuple[Arg, ...]:
    """The arguments after NACK's IDs for ``delay`` seconds (None: none)."""
    if delay is None:
        return ()
    if int(delay) < 0:
        raise ValueError("delay must be >= 0 seconds")
    return ("DELAY", int(delay))


#: WAITJOB's -NOJOB for an ID the node does not know (vs. a job removed while waited for).
NOJOB_UNKNOWN = "NOJOB Job not known"


def _acked(reply: Any) -> bool:
    """WAITJOB: True when acked, False on timeout (null)."""
    if reply is None:
        return False
    if reply == b"ACKED" or reply == "ACKED":
        return True
    raise ProtocolError(f"unexpected WAITJOB reply {reply!r}")


def wait_job(job_id: Arg, timeout_ms: int) -> Request:
    """WAITJOB (extension): the node holds the reply up to ``timeout_ms`` (0: forever)."""
    return request("WAITJOB", job_id, int(timeout_ms), parse=_acked,
                   wait=_seconds(int(timeout_ms)))


def working(job_id: Arg) -> Request:
    return request("WORKING", job_id, parse=_int)


#: IDs per WORKINGS (the node takes up to 10,000: disque.commands.jobs).
WORKINGS_IDS = 1000


def workings(job_ids: Sequence[Arg]) -> Request:
    """WORKINGS (this server's extension, docs/EXTENSIONS.md): WORKING for
    every ID in one command; the seconds or the error per ID, in order."""
    return Request((b"WORKINGS", *[job_id.encode("utf-8", "surrogateescape")
                                   if isinstance(job_id, str) else encode_arg(job_id)
                                   for job_id in job_ids]), _working_results)


def _working_results(reply: Any) -> list[int | DisqueError]:
    if not isinstance(reply, list):
        raise ProtocolError(f"expected an array, got {reply!r}")
    return [r if isinstance(r, DisqueError) else integer(r) for r in reply]


def working_requests(job_ids: Iterable[Arg]) -> list[Request]:
    """:func:`working` for many IDs: heartbeats go out by the thousand, and
    building each through :func:`request` cost more than the node's work."""
    name = b"WORKING"
    return [Request((name, job_id.encode("utf-8", "surrogateescape")), _int)
            if isinstance(job_id, str) else working(job_id)
            for job_id in job_ids]


def show(job_id: Arg) -> Request:
    return request("SHOW", job_id, parse=parse_show)


def qlen(queue: Arg) -> Request:
    return request("QLEN", queue, parse=_int)


def qstat(queue: Arg) -> Request:
    return request("QSTAT", queue, parse=_kv)


def qpeek(queue: Arg, count: int) -> Request:
    return request("QPEEK", queue, int(count), parse=parse_jobs)


def qscan_page(cursor: int, count: int | None = None, busyloop: bool = False,
               minlen: int | None = None, maxlen: int | None = None,
               importrate: int | None = None, min_priority: int | None = None) -> Request:
    args: list[Arg] = ["QSCAN", int(cursor)]
    if count is not None:
        args += ["COUNT", int(count)]
    if busyloop:
        args.append("BUSYLOOP")
    for name, value in (("MINLEN", minlen), ("MAXLEN", maxlen), ("IMPORTRATE", importrate),
                        ("MINPRIORITY", min_priority)):
        if value is not None:
            args += [name, int(value)]
    return request(*args, parse=_scan_page(text))


def jscan_page(cursor: int, count: int | None = None, busyloop: bool = False,
               queue: Arg | None = None, states: Iterable[str] = (),
               reply: str = "id", min_priority: int | None = None,
               group: Arg | None = None) -> Request:
    if reply not in ("id", "all"):
        raise ValueError("reply must be 'id' or 'all'")
    args: list[Arg] = ["JSCAN", int(cursor)]
    if count is not None:
        args += ["COUNT", int(count)]
    if busyloop:
        args.append("BUSYLOOP")
    if queue is not None:
        args += ["QUEUE", queue]
    for state in states:
        args += ["STATE", state]
    if min_priority is not None:
        args += ["MINPRIORITY", int(min_priority)]
    if group is not None:
        args += ["GROUP", group]
    args += ["REPLY", reply]
    return request(*args, parse=_scan_page(parse_show if reply == "all" else text))


def pause(queue: Arg, options: Sequence[str], bcast: bool = False) -> Request:
    opts = list(options) or ["state"]
    if bcast:
        opts.append("bcast")
    return request("PAUSE", queue, *opts, parse=text)


def qlimit(queue: Arg, max_jobs: int | None = None, period_ms: int | None = None,
           off: bool = False, bcast: bool = False) -> Request:
    """QLIMIT (an extension): read, set (``max_jobs`` per ``period_ms``) or
    lift (``off``) a queue's rate limit; the reply is the limit after it."""
    if (max_jobs is None) != (period_ms is None):
        raise ValueError("give both max_jobs and period_ms")
    if off and max_jobs is not None:
        raise ValueError("off=True lifts the limit: give no max_jobs/period_ms")
    args: list[Arg] = ["QLIMIT", queue]
    if off:
        args.append("OFF")
    elif max_jobs is not None and period_ms is not None:
        if int(max_jobs) < 1 or int(period_ms) < 1:
            raise ValueError("max_jobs and period_ms must be >= 1 (pause() stops a queue)")
        args += [int(max_jobs), int(period_ms)]
    elif bcast:
        raise ValueError("bcast needs a limit to set, or off=True")
    if bcast:
        args.append("BCAST")
    if len(args) == 2:
        return request(*args, parse=_limit)
    limit = None if off else (int(max_jobs or 0), int(period_ms or 0))

    def parse(reply: Any) -> tuple[int, int] | None:
        _ok(reply)
        return limit

    return request(*args, parse=parse)


def _limit(reply: Any) -> tuple[int, int] | None:
    if reply is None:
        return None
    if not isinstance(reply, list) or len(reply) != 2:
        raise ProtocolError(f"expected [max, period-ms], got {reply!r}")
    return integer(reply[0]), integer(reply[1])


def info(section: str | None = None) -> Request:
    args: list[Arg] = ["INFO"] if section is None else ["INFO", section]
    return request(*args, parse=parse_info)


def hello() -> Request:
    return request("HELLO", parse=parse_hello)


def ping(message: Arg | None = None) -> Request:
    args: list[Arg] = ["PING"] if message is None else ["PING", message]
    return request(*args)


def cluster_meet(host: str, port: int) -> Request:
    return request("CLUSTER", "MEET", host, int(port), parse=_ok)


def cluster_leaving(value: bool | None = None) -> Request:
    if value is None:
        return request("CLUSTER", "LEAVING", parse=lambda r: text(r) == "yes")

    def parse(reply: Any) -> bool:
        _ok(reply)
        return value

    return request("CLUSTER", "LEAVING", "yes" if value else "no", parse=parse)


def cluster_myid() -> Request:
    return request("CLUSTER", "MYID", parse=text)


def cluster_forget(node_id: str) -> Request:
    return request("CLUSTER", "FORGET", node_id, parse=_ok)


def cluster_reset(hard: bool = False) -> Request:
    return request("CLUSTER", "RESET", "HARD" if hard else "SOFT", parse=_ok)


def _parse_cluster_nodes(reply: Any) -> list[dict[str, Any]]:
    nodes = []
    for line in text(reply).splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        host, _, port = fields[1].rpartition(":")
        try:
            nodes.append({
                "id": fields[0], "host": host.strip("[]"), "port": int(port.split("@")[0]),
                "flags": fields[2].split(","), "ping_sent": int(fields[3]),
                "pong_recv": int(fields[4]), "link_state": fields[5],
            })
        except ValueError:
            raise ProtocolError(f"unexpected CLUSTER NODES line: {line!r}") from None
    return nodes


def cluster_nodes() -> Request:
    return request("CLUSTER", "NODES", parse=_parse_cluster_nodes)


def cluster_info() -> Request:
    return request("CLUSTER", "INFO", parse=lambda r: parse_info(r).get("", {}))


def config_get(pattern: str) -> Request:
    def parse(reply: Any) -> dict[str, str]:
        items = _text_list(reply)
        return dict(zip(items[::2], items[1::2], strict=True))
    return request("CONFIG", "GET", pattern, parse=parse)


def config_set(name: str, value: Arg) -> Request:
    return request("CONFIG", "SET", name, value, parse=_ok)
