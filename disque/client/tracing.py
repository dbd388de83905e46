"""OpenTelemetry for the client, after the messaging semantic conventions.

Used by :class:`~disque.client.Client` and :class:`~disque.client.AsyncClient`
(docs/TRACING.md).  Nothing here imports OpenTelemetry: :func:`telemetry`
looks the API up in ``sys.modules`` and answers None, cheaply, while no
provider is set.  The rest runs only with a provider.

Spans (``messaging.system`` = ``disque``):

* ``send {queue}``: ``add_job`` (PRODUCER, its context injected into the job's
  headers as the creation context) and ``add_jobs`` (CLIENT, with
  ``messaging.batch.message_count``, linked to one ``create {queue}`` span
  (PRODUCER) per job, whose context each job carries);
* ``receive {queue}`` (CLIENT): ``get_jobs``/``get_job``, linked to each
  job's creation context;
* ``process {queue}`` (CONSUMER): :meth:`Client.process`, the application's
  handling of jobs, linked to their creation contexts, its parent the
  ambient context;
* ``ack``/``fastack``/``nack {queue}`` (CLIENT, operation type ``settle``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._wire import Headers, Job

__all__ = ["telemetry", "Telemetry", "SYSTEM", "DELIVERY_COUNT", "as_text", "split_address"]

#: ``messaging.system``.
SYSTEM = "disque"
#: The job's delivery count (``1 + nacks + additional-deliveries``, known
#: when the job was fetched ``with_counters=True``): system-specific, so in
#: the ``messaging.disque`` namespace as the conventions ask.
DELIVERY_COUNT = "messaging.disque.message.delivery_count"
#: ``messaging.client.operation.duration``'s buckets (the conventions' advice).
DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
                    7.5, 10]
SCOPE = "disque.client"

#: The instruments of the providers last seen (the providers rarely change).
_cache: list[Telemetry] = []


#: Whether a provider may come from the environment: the API then loads it
#: on the first ``get_*_provider()`` call, so :func:`telemetry` asks that
#: way.  Read once: the variables name a provider to load at start-up.
_PROVIDERS_FROM_ENVIRONMENT = ("OTEL_PYTHON_TRACER_PROVIDER" in os.environ
                               or "OTEL_PYTHON_METER_PROVIDER" in os.environ)
_modules = sys.modules


def telemetry() -> Telemetry | None:
    """The instruments of the configured providers, or None (nothing to record).

    Called on every traced client call, so the usual answer, None, is
    cheap: a process that never imported OpenTelemetry pays one dictionary
    look-up; one that imported the API (redis-py does, when it is
    installed) and set no provider pays two more and two attribute reads.
    The API's ``get_tracer_provider()`` and ``get_meter_provider()`` would
    read the environment on each call while no provider is set; the
    globals they fill are read here instead, and the public calls made only
    once one is set (or may come from the environment, or the globals are
    not where this API version keeps them).
    """
    trace = _modules.get("opentelemetry.trace")
    if trace is None:
        return None
    if not _PROVIDERS_FROM_ENVIRONMENT:
        try:
            if trace._TRACER_PROVIDER is None:
                meters = _modules.get("opentelemetry.metrics._internal")
                if meters is None or meters._METER_PROVIDER is None:
                    return None
        except AttributeError:
            pass  # an API keeping them elsewhere: ask it
    return _configured(trace)


def _configured(trace: Any) -> Telemetry | None:
    tracer_provider = trace.get_tracer_provider()
    if isinstance(tracer_provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        tracer_provider = None
    metrics = sys.modules.get("opentelemetry.metrics")
    meter_provider = None
    if metrics is not None:
        meter_provider = metrics.get_meter_provider()
        if type(meter_provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
            meter_provider = None
    if tracer_provider is None and meter_provider is None:
        return None
    found = _cache[0] if _cache else None
    if (found is None or found.tracer_provider is not tracer_provider
            or found.meter_provider is not meter_provider):
        found = Telemetry(tracer_provider, meter_provider)
        _cache[:] = [found]
    return found


def as_text(value: Any) -> str:
    """A header name or value as text (bytes decoded as UTF-8, bad bytes replaced)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def error_type(exc: BaseException) -> str:
    """``error.type``: the exception's class (low cardinality, as asked)."""
    return type(exc).__qualname__


def split_address(address: str | None) -> dict[str, Any]:
    """``server.address``/``server.port`` of ``host:port`` (None: nothing)."""
    if not address:
        return {}
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return {}
    return {"server.address": host.strip("[]"), "server.port": int(port)}


def delivery_count(job: Job) -> int | None:
    if job.nacks is None or job.additional_deliveries is None:
        return None
    return 1 + job.nacks + job.additional_deliveries


def job_carrier(job: Job) -> Mapping[str, Any] | None:
    """The headers a job's creation context is read from: its headers when
    the user asked for them, else what the client kept while tracing."""
    if job.headers is not None:
        return job.headers
    return job.trace_context


class _Carrier:
    """Getter/setter for the propagator over a job's headers (bytes or text)."""

    @staticmethod
    def get(carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [as_text(value)]

    @staticmethod
    def keys(carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)

    @staticmethod
    def set(carrier: dict[str, str], key: str, value: str) -> None:
        carrier[key] = value


class Operation:
    """One client operation being traced: its span (if tracing), timing and
    the attributes its metrics get."""

    def __init__(self, owner: Telemetry, name: str, kind_type: str, queue: str | None,
                 address: str | None) -> None:
        self.owner = owner
        self.name = name
        self.type = kind_type
        self.queue = queue
        self.span: Any = None
        self.attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.name": name,
            "messaging.operation.type": kind_type}
        if queue is not None:
            self.attributes["messaging.destination.name"] = queue
        self.attributes.update(split_address(address))
        self.start = time.perf_counter()
        self.error: BaseException | None = None

    def span_name(self) -> str:
        return self.name if self.queue is None else f"{self.name} {self.queue}"

    def at(self, address: str | None) -> None:
        """The node the command went to (known once it was sent)."""
        found = split_address(address)
        self.attributes.update(found)
        if self.span is not None and found:
            self.span.set_attributes(found)

    def failed(self, exc: BaseException) -> None:
        self.error = exc
        self.attributes["error.type"] = error_type(exc)
        if self.span is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_attribute("error.type", error_type(exc))
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, str(exc)))

    def metric_attributes(self) -> dict[str, Any]:
        return {k: v for k, v in self.attributes.items()
                if k in _METRIC_ATTRIBUTES}

    def finish(self, duration_metric: Any) -> None:
        elapsed = time.perf_counter() - self.start
        if duration_metric is not None:
            duration_metric.record(elapsed, self.metric_attributes())
        if self.span is not None:
            self.span.end()


_METRIC_ATTRIBUTES = frozenset({
    "messaging.system", "messaging.operation.name", "messaging.operation.type",
    "messaging.destination.name", "server.address", "server.port", "error.type"})


class Telemetry:
    """The tracer and the instruments of one pair of providers."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry import propagate, trace

        from .. import __version__

        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.trace = trace
        self.propagate = propagate
        self.tracer = (tracer_provider.get_tracer(SCOPE, __version__)
                       if tracer_provider is not None else None)
        self.duration = self.sent = self.consumed = self.process_duration = None
        if meter_provider is not None:
            meter = meter_provider.get_meter(SCOPE, __version__)
            self.duration = meter.create_histogram(
                "messaging.client.operation.duration", unit="s",
                description="Duration of messaging operation initiated by a producer or "
                            "consumer client.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
            self.sent = meter.create_counter(
                "messaging.client.sent.messages", unit="{message}",
                description="Number of messages producer attempted to send to the broker.")
            self.consumed = meter.create_counter(
                "messaging.client.consumed.messages", unit="{message}",
                description="Number of messages that were delivered to the application.")
            self.process_duration = meter.create_histogram(
                "messaging.process.duration", unit="s",
                description="Duration of processing operation.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS)

    @property
    def tracing(self) -> bool:
        return self.tracer is not None

    # -------------------------------------------------------------- helpers

    def _fields(self) -> set[str]:
        return set(self.propagate.get_global_textmap().fields)

    def has_context(self, headers: Headers | None) -> bool:
        """Whether the user's headers carry a creation context of their own."""
        if not headers:
            return False
        fields = self._fields()
        names = headers.keys() if isinstance(headers, Mapping) else (n for n, _ in headers)
        return any(as_text(name) in fields for name in names)

    def _extract(self, carrier: Mapping[str, Any] | None) -> Any:
        """The span context a job's headers carry, or None."""
        if not carrier:
            return None
        ctx = self.propagate.extract(carrier, getter=_Carrier)  # type: ignore[arg-type]
        span_context = self.trace.get_current_span(ctx).get_span_context()
        return span_context if span_context.is_valid else None

    def _inject(self, span: Any) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.propagate.inject(carrier, context=self.trace.set_span_in_context(span),
                              setter=_Carrier)  # type: ignore[arg-type]
        return carrier

    def keep_context(self, job: Job) -> dict[str, str] | None:
        """The propagator's headers of a job (kept on it for ``process``)."""
        if not job.headers:
            return None
        fields = self._fields()
        kept = {name: as_text(value) for name, value in job.headers.items() if name in fields}
        return kept or None

    # ----------------------------------------------------------- producers

    @contextmanager
    def send(self, queue: Any, headers: Headers | None,
             address: str | None) -> Iterator[SendOne]:
        """``send {queue}`` for one job: yields the headers to send."""
        op = Operation(self, "send", "send", as_text(queue), address)
        own = self.has_context(headers)
        merged = headers
        if self.tracer is not None:
            kind = self.trace.SpanKind.CLIENT if own else self.trace.SpanKind.PRODUCER
            links = []
            if own:
                carrier = dict(headers.items()) if isinstance(headers, Mapping) else {
                    as_text(n): v for n, v in headers}  # type: ignore[union-attr]
                user = self._extract(carrier)
                if user is not None:
                    links.append(self.trace.Link(user))
            op.span = self.tracer.start_span(op.span_name(), kind=kind,
                                             attributes=dict(op.attributes), links=links)
            if not own:
                merged = _merge(headers, self._inject(op.span))
        result = SendOne(op, merged)
        try:
            with self._running(op):
                yield result
        finally:
            if self.sent is not None:
                self.sent.add(1, op.metric_attributes())
            op.finish(self.duration)

    @contextmanager
    def send_batch(self, queue: Any, count: int, headers: Headers | None,
                   job_headers: list[Any] | None,
                   address: str | None) -> Iterator[SendBatch]:
        """``send {queue}`` for many jobs, each with its own ``create`` span."""
        op = Operation(self, "send", "send", as_text(queue), address)
        per_job: list[Any] = list(job_headers) if job_headers is not None else [None] * count
        creates: list[Any] = []
        links = []
        if self.tracer is not None:
            shared_own = self.has_context(headers)
            for i, own_headers in enumerate(per_job):
                if shared_own or self.has_context(own_headers):
                    carrier = _as_text_dict(headers) | _as_text_dict(own_headers)
                    user = self._extract(carrier)
                    if user is not None:
                        links.append(self.trace.Link(user))
                    creates.append(None)
                    continue
                create = self.tracer.start_span(
                    f"create {op.queue}", kind=self.trace.SpanKind.PRODUCER,
                    attributes={**{k: v for k, v in op.attributes.items()},
                                "messaging.operation.name": "create",
                                "messaging.operation.type": "create"})
                creates.append(create)
                links.append(self.trace.Link(create.get_span_context()))
                per_job[i] = _merge(own_headers, self._inject(create))
            op.span = self.tracer.start_span(
                op.span_name(), kind=self.trace.SpanKind.CLIENT,
                attributes={**op.attributes, "messaging.batch.message_count": count},
                links=links)
        result = SendBatch(op, per_job if (job_headers is not None or creates) else None)
        try:
            with self._running(op):
                yield result
        finally:
            for create, job_id in zip(creates, result.ids + [None] * len(creates),
                                      strict=False):
                if create is None:
                    continue
                if isinstance(job_id, str):
                    create.set_attribute("messaging.message.id", job_id)
                elif job_id is not None:
                    create.set_attribute("error.type", error_type(job_id))
                create.end()
            failures = [r for r in result.ids if isinstance(r, BaseException)]
            if failures and op.error is None:
                op.failed(failures[0])
            if self.sent is not None:
                self.sent.add(count, op.metric_attributes())
            op.finish(self.duration)

    # ----------------------------------------------------------- consumers

    @contextmanager
    def receive(self, queues: Sequence[Any], batch: bool) -> Iterator[Receive]:
        """``receive {queue}``: the span starts once the jobs are known (its
        links are given at its start, for samplers), dated from the call."""
        queue = as_text(queues[0]) if len(queues) == 1 else None
        op = Operation(self, "receive", "receive", queue, None)
        start_ns = time.time_ns()
        result = Receive(op)
        try:
            yield result
        except BaseException as exc:
            op.failed(exc)
            self._receive_span(op, result, start_ns, batch)
            op.finish(self.duration)
            raise
        self._receive_span(op, result, start_ns, batch)
        if self.consumed is not None and result.jobs:
            self.consumed.add(len(result.jobs), op.metric_attributes())
        op.finish(self.duration)

    def _receive_span(self, op: Operation, result: Receive, start_ns: int,
                      batch: bool) -> None:
        if self.tracer is None:
            return
        jobs = result.jobs
        attributes = dict(op.attributes)
        if batch:
            attributes["messaging.batch.message_count"] = len(jobs)
        elif jobs:
            attributes["messaging.message.id"] = jobs[0].id
            count = delivery_count(jobs[0])
            if count is not None:
                attributes[DELIVERY_COUNT] = count
        error = attributes.pop("error.type", None)
        span = self.tracer.start_span(op.span_name(), kind=self.trace.SpanKind.CLIENT,
                                      attributes=attributes, links=self.links(jobs),
                                      start_time=start_ns)
        op.span = span
        if error is not None and op.error is not None:
            op.failed(op.error)

    def links(self, jobs: Iterable[Job]) -> list[Any]:
        """One link per job to its creation context (jobs without one: none)."""
        links = []
        for job in jobs:
            context = self._extract(job_carrier(job))
            if context is None:
                continue
            attributes: dict[str, Any] = {"messaging.message.id": job.id,
                                          "messaging.destination.name": job.queue}
            count = delivery_count(job)
            if count is not None:
                attributes[DELIVERY_COUNT] = count
            links.append(self.trace.Link(context, attributes))
        return links

    @contextmanager
    def process(self, jobs: Sequence[Job], parent_from_job: bool,
                address: str | None) -> Iterator[Any]:
        """``process {queue}`` (CONSUMER) around the application's handling."""
        queues = {job.queue for job in jobs}
        queue = next(iter(queues)) if len(queues) == 1 else None
        op = Operation(self, "process", "process", queue, address)
        if self.tracer is not None:
            attributes = dict(op.attributes)
            if len(jobs) == 1:
                attributes["messaging.message.id"] = jobs[0].id
                count = delivery_count(jobs[0])
                if count is not None:
                    attributes[DELIVERY_COUNT] = count
            else:
                attributes["messaging.batch.message_count"] = len(jobs)
            links = self.links(jobs)
            context = None
            if parent_from_job and len(jobs) == 1:
                creation = self._extract(job_carrier(jobs[0]))
                if creation is not None:
                    ambient = self.trace.get_current_span().get_span_context()
                    if ambient.is_valid:
                        links.append(self.trace.Link(ambient))
                    context = self.trace.set_span_in_context(
                        self.trace.NonRecordingSpan(creation))
            op.span = self.tracer.start_span(op.span_name(), context=context,
                                             kind=self.trace.SpanKind.CONSUMER,
                                             attributes=attributes, links=links)
        try:
            with self._running(op):
                yield op.span
        finally:
            op.finish(self.process_duration)

    @contextmanager
    def settle(self, name: str, ids: Sequence[Any], address: str | None) -> Iterator[Operation]:
        """``ack``/``fastack``/``nack`` (operation type ``settle``, CLIENT)."""
        op = Operation(self, name.lower(), "settle", None, address)
        if self.tracer is not None:
            attributes = dict(op.attributes)
            if len(ids) == 1:
                attributes["messaging.message.id"] = as_text(ids[0])
            else:
                attributes["messaging.batch.message_count"] = len(ids)
            op.span = self.tracer.start_span(op.span_name(), kind=self.trace.SpanKind.CLIENT,
                                             attributes=attributes)
        try:
            with self._running(op):
                yield op
        finally:
            op.finish(self.duration)

    @contextmanager
    def _running(self, op: Operation) -> Iterator[None]:
        """``op``'s span (if any) current while the caller's block runs; an
        exception leaving the block marks ``op`` failed, and goes on."""
        try:
            if op.span is None:
                yield
            else:
                with self.trace.use_span(op.span, end_on_exit=False, record_exception=False,
                                         set_status_on_exception=False):
                    yield
        except BaseException as exc:
            op.failed(exc)
            raise


class SendOne:
    """What :meth:`Telemetry.send` yields: the headers to send."""

    def __init__(self, op: Operation, headers: Headers | None) -> None:
        self.op = op
        self.headers = headers

    def sent(self, job_id: str, address: str | None) -> None:
        self.op.at(address)
        if self.op.span is not None:
            self.op.span.set_attribute("messaging.message.id", job_id)


class SendBatch:
    """What :meth:`Telemetry.send_batch` yields: each job's headers to send
    (None: the call's own ``job_headers`` stay as given)."""

    def __init__(self, op: Operation, job_headers: list[Any] | None) -> None:
        self.op = op
        self.job_headers = job_headers
        self.ids: list[Any] = []

    def sent(self, ids: list[Any], address: str | None) -> None:
        self.ids = list(ids)
        self.op.at(address)


class Receive:
    """What :meth:`Telemetry.receive` yields: give it the jobs received."""

    def __init__(self, op: Operation) -> None:
        self.op = op
        self.jobs: list[Job] = []

    def received(self, jobs: list[Job], address: str | None) -> None:
        self.jobs = jobs
        self.op.at(address)


def _as_text_dict(headers: Any) -> dict[str, Any]:
    if not headers:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {as_text(name): value for name, value in items}


def _merge(headers: Any, context: dict[str, str]) -> Any:
    """The user's headers followed by the injected context."""
    if not context:
        return headers
    if not headers:
        return context
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    return items + list(context.items())
