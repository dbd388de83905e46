"""OpenTelemetry for the Spark connectors (docs/TRACING.md, "Spark").

Spans, after the messaging conventions as the client makes them
(:mod:`disque.client.tracing`):

* ``receive {queue}`` (CLIENT): one per fetch that got jobs (a micro-batch's
  GETJOBs on one node: driver fetch mode on the query's driver side,
  executor fetch mode and batch drains in the task), dated from the fetch's
  start, with ``messaging.batch.message_count`` and one link per job to its
  creation context (its headers' ``traceparent``/``tracestate``, read by the
  global propagator), at most :data:`MAX_LINKS`;
* ``send {queue}`` (PRODUCER, or CLIENT when every row carries its own
  context): one per Arrow batch and queue a sink task writes; its context is
  injected into the headers of the rows that carry none, and it links to
  the contexts of those that do (at most :data:`MAX_LINKS`).

Nothing here imports OpenTelemetry: :func:`tracer` asks
:func:`disque.client.tracing.telemetry`, which looks the API up in
``sys.modules``, so a Spark process where no one set a tracer provider pays
a dictionary look-up per fetch and per write task.  Spark's Python workers and
the query's driver-side process are processes of their own: the option
``telemetrySetup`` (``module:function``) names a function the connector
calls once per such process, before its first span (:func:`setup`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable, Sequence
from typing import Any

from disque.client.tracing import DELIVERY_COUNT, SYSTEM, as_text, split_address, telemetry

__all__ = ["MAX_LINKS", "SCOPE", "setup", "resolve", "tracer", "flush", "Tracing", "SendSpans"]

#: Links per span at most: the SDK keeps 128 by default
#: (``OTEL_SPAN_LINK_COUNT_LIMIT``) and drops the rest silently, so a span
#: of a 100 000-job batch would carry an arbitrary 128 of them anyway;
#: these are the first 128 jobs (rows) that carry a context.
MAX_LINKS = 128
#: The instrumentation scope of the connectors' spans.
SCOPE = "disque.spark_connector"

#: ``telemetrySetup`` values already called in this process (None), or the
#: error their call raised (raised again: a failed set-up fails every task).
_called: dict[str, BaseException | None] = {}


def resolve(spec: str) -> Any:
    """The function ``module:function`` names (imported, not called)."""
    from .options import OptionError

    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise OptionError("telemetrySetup", f"must be module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise OptionError("telemetrySetup", f"names module {module_name!r}, which cannot be "
                          f"imported in this Python process: {exc}") from exc
    function: Any = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise OptionError("telemetrySetup", f"names {name!r}, which module "
                              f"{module_name!r} does not have")
    if not callable(function):
        raise OptionError("telemetrySetup", f"names {spec!r}, which is not callable")
    return function


def setup(spec: str | None) -> None:
    """Call ``telemetrySetup``'s function once in this Python process.

    Spark reuses its Python workers for many tasks, and the query's driver
    side lives as long as the query: the SDK is set up once per process,
    before the first span.  A function that raises fails the task (or the
    query) saying so, each time it would be needed.
    """
    if spec is None:
        return
    if spec in _called:
        error = _called[spec]
        if error is not None:
            raise error
        return
    try:
        resolve(spec)()
    except Exception as exc:
        error = RuntimeError(f"disque data source: option 'telemetrySetup': {spec} raised "
                             f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        _called[spec] = error
        raise error from exc
    _called[spec] = None


_cache: list[Tracing] = []


def tracer() -> Tracing | None:
    """The connectors' tracing, or None when this process has no tracer provider."""
    found = telemetry()
    if found is None or not found.tracing:
        return None
    cached = _cache[0] if _cache else None
    if cached is None or cached.provider is not found.tracer_provider:
        cached = Tracing(found.tracer_provider)
        _cache[:] = [cached]
    return cached


def flush() -> None:
    """Export the spans this process holds (an SDK provider's ``force_flush``).

    Spark ends its Python workers with ``os._exit`` (no ``atexit`` hook
    runs), so a task that made spans flushes them before it returns; with a
    ``BatchSpanProcessor`` they would otherwise wait for its next round.
    """
    if not _cache:
        return
    force_flush = getattr(_cache[0].provider, "force_flush", None)
    if force_flush is not None:
        force_flush()


class Tracing:
    """The connectors' tracer, and the propagator's view of job headers."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import propagate, trace

        from disque import __version__

        self.provider = provider
        self.trace = trace
        self.propagate = propagate
        self.tracer = provider.get_tracer(SCOPE, __version__)

    def fields(self) -> frozenset[bytes]:
        """The header names the global propagator reads and writes, as bytes."""
        return frozenset(name.encode() for name in self.propagate.get_global_textmap().fields)

    def extract(self, pairs: Iterable[tuple[Any, Any]]) -> Any:
        """The span context a job's headers carry (name, value pairs), or None.
        Of a name given twice, the first counts."""
        carrier: dict[str, str] = {}
        for name, value in pairs:
            carrier.setdefault(as_text(name), as_text(value))
        if not carrier:
            return None
        context = self.propagate.extract(carrier)
        span_context = self.trace.get_current_span(context).get_span_context()
        return span_context if span_context.is_valid else None

    def inject(self, span: Any) -> list[tuple[bytes, bytes]]:
        """The headers that carry ``span``'s context (``traceparent``...)."""
        carrier: dict[str, str] = {}
        self.propagate.inject(carrier, context=self.trace.set_span_in_context(span))
        return [(name.encode(), value.encode()) for name, value in carrier.items()]

    @staticmethod
    def attributes(operation: str, queue: str | None, address: str | None) -> dict[str, Any]:
        found: dict[str, Any] = {"messaging.system": SYSTEM,
                                 "messaging.operation.name": operation,
                                 "messaging.operation.type": operation}
        if queue is not None:
            found["messaging.destination.name"] = queue
        found.update(split_address(address))
        return found

    def receive(self, queues: Sequence[str], address: str | None, started_ns: int,
                jobs: Iterable[tuple[Any, Any, int, int, list[Any] | None]],
                count: int) -> None:
        """``receive {queue}`` for a fetch of ``count`` jobs, started at
        ``started_ns`` (the span starts now, its links known, as samplers
        want them); ``jobs``: (id, queue, nacks, additional deliveries,
        flat headers) of each, read until :data:`MAX_LINKS` links are found."""
        queue = queues[0] if len(queues) == 1 else None
        fields = self.fields()
        links: list[Any] = []
        for job_id, job_queue, nacks, additional, flat in jobs:
            if len(links) >= MAX_LINKS:
                break
            if not flat:
                continue
            pairs = [(name, value) for name, value in zip(flat[0::2], flat[1::2], strict=True)
                     if name in fields]
            context = self.extract(pairs) if pairs else None
            if context is None:
                continue
            links.append(self.trace.Link(context, {
                "messaging.message.id": as_text(job_id),
                "messaging.destination.name": as_text(job_queue),
                DELIVERY_COUNT: 1 + int(nacks) + int(additional)}))
        attributes = self.attributes("receive", queue, address)
        attributes["messaging.batch.message_count"] = count
        name = "receive" if queue is None else f"receive {queue}"
        span = self.tracer.start_span(name, kind=self.trace.SpanKind.CLIENT,
                                      attributes=attributes, links=links,
                                      start_time=started_ns)
        span.end()


class SendSpans:
    """The ``send {queue}`` spans of one Arrow batch a sink task writes."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self.spans: dict[bytes, Any] = {}
        self.started_ns = time.time_ns()

    def start(self, queue: bytes, count: int, own: Sequence[Any], injects: bool) -> Any:
        """The span for ``count`` rows of ``queue``: PRODUCER when its context
        goes into some rows' headers (``injects``), CLIENT when each row
        carries its own (``own``: those contexts, linked)."""
        tracing = self.tracing
        name = queue.decode("utf-8", "replace")
        attributes = tracing.attributes("send", name, None)
        attributes["messaging.batch.message_count"] = count
        kind = tracing.trace.SpanKind.PRODUCER if injects else tracing.trace.SpanKind.CLIENT
        links = [tracing.trace.Link(context) for context in own[:MAX_LINKS]]
        span = tracing.tracer.start_span(f"send {name}", kind=kind, attributes=attributes,
                                         links=links, start_time=self.started_ns)
        self.spans[queue] = span
        return span

    def finish(self, address: str | None, error: BaseException | None = None) -> None:
        """End the spans: the node the rows went to, or the error that stopped them."""
        found = split_address(address)
        for span in self.spans.values():
            if found:
                span.set_attributes(found)
            if error is not None:
                from opentelemetry.trace import Status, StatusCode

                span.set_attribute("error.type", type(error).__qualname__)
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()
        self.spans.clear()
