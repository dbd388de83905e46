"""OpenTelemetry in the client (disque/client/tracing.py, docs/TRACING.md),
with the real SDK (in-memory span exporter and metric reader) against real
nodes: the spans' names, kinds, attributes and links against the messaging
conventions, the metrics, the creation context in the job's headers, across
a 3-node cluster and across processes; and nothing at all without a provider."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the dev extra: opentelemetry-sdk")

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once

from disque import AsyncClient, Client
from disque.client import tracing
from tests.client.conftest import address
from tests.support.cluster import ReferenceProcess, join, reference_server, wait_joined
from tests.support.process import DisqueProcess

ROOT = Path(__file__).resolve().parents[2]


def _reset_globals() -> None:
    """Forget the global providers (as OpenTelemetry's own test utilities do):
    the other client tests run without tracing."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    from opentelemetry.metrics import _internal as metrics_internal

    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None


class Otel:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        (found,) = self.spans(name)
        return found

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> its data points."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    _reset_globals()
    o = Otel()
    trace.set_tracer_provider(o.tracer_provider)
    metrics.set_meter_provider(o.meter_provider)
    yield o
    o.tracer_provider.shutdown()
    o.meter_provider.shutdown()
    _reset_globals()
    assert tracing.telemetry() is None


def traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def common(span: ReadableSpan, operation: str, kind_type: str, port: int) -> None:
    attrs = span.attributes or {}
    assert attrs["messaging.system"] == "disque"
    assert attrs["messaging.operation.name"] == operation
    assert attrs["messaging.operation.type"] == kind_type
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == port


def test_send_receive_process_settle(otel: Otel, server: DisqueProcess) -> None:
    with Client(address(server)) as client:
        tracer = otel.tracer_provider.get_tracer("app")
        with tracer.start_as_current_span("request"):
            job_id = client.add_job("orders", b"x", retry=60)
        send = otel.span("send orders")
        assert send.kind is SpanKind.PRODUCER
        common(send, "send", "send", server.port)
        assert send.attributes["messaging.destination.name"] == "orders"
        assert send.attributes["messaging.message.id"] == job_id
        assert "messaging.batch.message_count" not in send.attributes
        assert send.parent is not None and send.parent.span_id == otel.span(
            "request").get_span_context().span_id
        # The creation context is the send span's, in the job's headers.
        assert client.show(job_id)["headers"] == {"traceparent": traceparent(send).encode()}

        jobs = client.get_jobs("orders", count=5, nohang=True, with_counters=True)
        assert [j.id for j in jobs] == [job_id]
        assert jobs[0].headers is None  # not asked for: not given
        assert jobs[0].trace_context == {"traceparent": traceparent(send)}
        receive = otel.span("receive orders")
        assert receive.kind is SpanKind.CLIENT
        common(receive, "receive", "receive", server.port)
        assert receive.attributes["messaging.batch.message_count"] == 1
        (link,) = receive.links
        assert link.context.span_id == send.get_span_context().span_id
        assert link.context.trace_id == send.get_span_context().trace_id
        assert link.attributes["messaging.message.id"] == job_id
        assert link.attributes[tracing.DELIVERY_COUNT] == 1

        with tracer.start_as_current_span("worker") as worker, client.process(jobs[0]) as span:
            assert span is trace.get_current_span()
        process = otel.span("process orders")
        assert process.kind is SpanKind.CONSUMER
        common(process, "process", "process", server.port)
        assert process.parent.span_id == worker.get_span_context().span_id  # ambient
        assert process.attributes["messaging.message.id"] == job_id
        assert process.attributes[tracing.DELIVERY_COUNT] == 1
        assert [lk.context.span_id for lk in process.links] == [send.get_span_context().span_id]

        assert client.ack(job_id) == 1
        ack = otel.span("ack")
        assert ack.kind is SpanKind.CLIENT
        common(ack, "ack", "settle", server.port)
        assert ack.attributes["messaging.message.id"] == job_id

        found = otel.metrics()
        durations = {p.attributes["messaging.operation.name"]: p
                     for p in found["messaging.client.operation.duration"]}
        assert set(durations) == {"send", "receive", "ack"}
        assert durations["send"].attributes["messaging.destination.name"] == "orders"
        assert durations["send"].attributes["server.port"] == server.port
        assert list(durations["send"].explicit_bounds) == tracing.DURATION_BUCKETS
        (sent,) = found["messaging.client.sent.messages"]
        (consumed,) = found["messaging.client.consumed.messages"]
        (processed,) = found["messaging.process.duration"]
        assert (sent.value, consumed.value, processed.count) == (1, 1, 1)
        assert consumed.attributes["messaging.operation.name"] == "receive"


def test_batches_get_a_create_span_per_job(otel: Otel, server: DisqueProcess) -> None:
    with Client(address(server)) as client:
        ids = client.add_jobs("q", [b"a", b"b", b"c"], headers={"tenant": "acme"})
        send = otel.span("send q")
        creates = otel.spans("create q")
        assert send.kind is SpanKind.CLIENT  # its context is no job's creation context
        assert send.attributes["messaging.batch.message_count"] == 3
        assert [c.kind for c in creates] == [SpanKind.PRODUCER] * 3
        assert [c.attributes["messaging.message.id"] for c in creates] == ids
        assert [lk.context.span_id for lk in send.links] == [
            c.get_span_context().span_id for c in creates]
        jobs = client.get_jobs("q", count=3, with_headers=True)
        assert [j.headers for j in jobs] == [
            {"tenant": b"acme", "traceparent": traceparent(c).encode()} for c in creates]
        assert jobs[0].trace_context is None  # the headers were asked for: they hold it
        receive = otel.span("receive q")
        assert [lk.context.span_id for lk in receive.links] == [
            c.get_span_context().span_id for c in creates]

        with client.process(*jobs):
            pass
        process = otel.span("process q")
        assert process.attributes["messaging.batch.message_count"] == 3
        assert "messaging.message.id" not in process.attributes
        assert len(process.links) == 3
        assert client.ack_many(j.id for j in jobs) == 3
        ack = otel.span("ack")
        assert ack.attributes["messaging.batch.message_count"] == 3
        (sent,) = otel.metrics()["messaging.client.sent.messages"]
        assert sent.value == 3


def test_the_users_own_traceparent_wins(otel: Otel, server: DisqueProcess) -> None:
    mine = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with Client(address(server)) as client:
        job_id = client.add_job("q", b"x", headers={"traceparent": mine})
        send = otel.span("send q")
        assert send.kind is SpanKind.CLIENT
        (link,) = send.links
        assert f"{link.context.trace_id:032x}" == mine.split("-")[1]
        assert client.show(job_id)["headers"] == {"traceparent": mine.encode()}
        ids = client.add_jobs("q", [b"a", b"b"], job_headers=[{"traceparent": mine}, None])
        assert len(otel.spans("create q")) == 1  # none for the job that has its own
        jobs = client.get_jobs("q", count=3, with_headers=True)
        assert jobs[1].id == ids[0] and jobs[1].headers == {"traceparent": mine.encode()}


def test_parent_from_job_continues_the_producers_trace(otel: Otel,
                                                      server: DisqueProcess) -> None:
    with Client(address(server)) as client:
        client.add_job("q", b"x")
        send = otel.span("send q")
        job = client.get_job("q")
        receive = otel.span("receive q")
        assert "messaging.batch.message_count" not in receive.attributes  # one-job API
        assert receive.attributes["messaging.message.id"] == job.id
        tracer = otel.tracer_provider.get_tracer("app")
        with tracer.start_as_current_span("http") as http, client.process(
                job, parent_from_job=True):
            pass
        process = otel.span("process q")
        assert process.parent.span_id == send.get_span_context().span_id
        assert process.context.trace_id == send.context.trace_id
        assert {lk.context.span_id for lk in process.links} == {
            send.context.span_id, http.get_span_context().span_id}


def test_failures_set_error_type(otel: Otel, server: DisqueProcess) -> None:
    from disque import BadId

    with Client(address(server)) as client, pytest.raises(BadId):
        client.ack("not-an-id")
    ack = otel.span("ack")
    assert ack.attributes["error.type"] == "BadId"
    assert ack.status.status_code is trace.StatusCode.ERROR
    (point,) = otel.metrics()["messaging.client.operation.duration"]
    assert point.attributes["error.type"] == "BadId"
    with Client(address(server)) as client, pytest.raises(RuntimeError), \
            client.process(client.get_job("none", nohang=True) or _fake_job()):
        raise RuntimeError("handler failed")
    assert otel.span("process q").attributes["error.type"] == "RuntimeError"


def _fake_job() -> Any:
    from disque import Job

    return Job("q", "D-00000000-" + "A" * 24 + "-0001", b"")


def test_a_node_refusing_headers_still_gets_the_job(otel: Otel, server: DisqueProcess) -> None:
    """As an original node would (a syntax error): the job goes without its
    context, and the client stops sending it to that node."""
    with Client(address(server)) as client:
        client.execute_command("CONFIG", "SET", "max-job-headers", "0")
        job_id = client.add_job("q", b"x")
        assert client._no_headers == {client.node_id}
        assert "headers" not in client.show(job_id)
        client.add_job("q", b"y")
        assert otel.spans("send q")[0].kind is SpanKind.PRODUCER
        assert len(client.get_jobs("q", count=2)) == 2
    with Client(address(server)) as client:  # a batch: the refused jobs sent again
        ids = client.add_jobs("q", [b"a", b"b"], batch_size=1)
        assert client._no_headers == {client.node_id}
        assert [j.id for j in client.get_jobs("q", count=2)] == ids
        assert all("headers" not in client.show(i) for i in ids)
        assert len(client.get_jobs("q", nohang=True)) == 0


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_an_original_node_gets_its_jobs_without_context(otel: Otel, tmp_path: Path) -> None:
    """The original answers HEADER and WITHHEADERS with a syntax error: the
    jobs go and come plain, the spans are still made (without links)."""
    original = ReferenceProcess(tmp_path / "ref").start()
    try:
        with Client(address(original), socket_timeout=10) as client:
            job_id = client.add_job("q", b"x", retry=30)
            ids = client.add_jobs("q", [b"a", b"b"])
            assert client._no_headers == {client.node_id}
            jobs = client.get_jobs("q", count=3)
            assert [j.id for j in jobs] == [job_id, *ids]
            assert [j.body for j in jobs] == [b"x", b"a", b"b"]
            assert all(j.headers is None and j.trace_context is None for j in jobs)
            assert client.ack(*[j.id for j in jobs]) == 3
        send, batch = otel.spans("send q")
        common(send, "send", "send", original.port)
        assert (send.attributes or {})["messaging.message.id"] == job_id
        assert (batch.attributes or {})["messaging.batch.message_count"] == 2
        # Each create span still ends, with its job's ID (the job went plain).
        assert sorted((s.attributes or {})["messaging.message.id"]
                      for s in otel.spans("create q")) == sorted(ids)
        receive = otel.span("receive q")
        assert (receive.attributes or {})["messaging.batch.message_count"] == 3
        assert list(receive.links) == []
        assert otel.span("ack").attributes["messaging.batch.message_count"] == 3
    finally:
        original.kill()


def test_async_client(otel: Otel, server: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncClient(address(server)) as client:
            job_id = await client.add_job("aq", b"x")
            (job,) = await client.get_jobs("aq")
            with client.process(job):
                pass
            await client.nack(job_id)
            await client.fastack(job_id)

    asyncio.run(main())
    send, receive, process = otel.span("send aq"), otel.span("receive aq"), otel.span(
        "process aq")
    assert (send.kind, receive.kind, process.kind) == (
        SpanKind.PRODUCER, SpanKind.CLIENT, SpanKind.CONSUMER)
    assert receive.links[0].context.span_id == send.context.span_id
    assert process.links[0].context.span_id == send.context.span_id
    assert otel.span("nack").attributes["messaging.operation.type"] == "settle"
    assert otel.span("fastack").attributes["messaging.operation.type"] == "settle"


def test_delivered_by_another_node(otel: Otel, server_factory) -> None:
    """Added on one node, delivered by another (federation): the receive
    span names the node that delivered it and still links to the creation
    context, which travelled with the job."""
    nodes = [server_factory() for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    with Client(address(nodes[0]), randomize=False) as producer:
        job_id = producer.add_job("fed", b"x", replicate=2)
    send = otel.span("send fed")
    holders = {n.port for n in nodes if n.client().execute_command("SHOW", job_id)}
    (other,) = [n for n in nodes if n.port not in holders]
    with Client(address(other), randomize=False) as consumer:
        jobs = consumer.get_jobs("fed", timeout_ms=10_000)
        assert [j.id for j in jobs] == [job_id]
        receive = otel.span("receive fed")
        assert receive.attributes["server.port"] == other.port
        assert receive.links[0].context.span_id == send.context.span_id
        assert consumer.ack(job_id) == 1


# --------------------------------------------------------------------------
# Without a provider, and across processes
# --------------------------------------------------------------------------

def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def test_without_a_provider_nothing_is_imported_or_injected(server: DisqueProcess) -> None:
    out = run_python("""
        import sys
        import redis  # redis-py 8 imports OpenTelemetry itself when installed
        from disque import Client

        def loaded():
            return {m for m in sys.modules if m.startswith("opentelemetry")}

        before = loaded()
        c = Client(sys.argv[1])
        job_id = c.add_job("q", b"x")
        print("imported" if loaded() - before else "no")
        import opentelemetry.trace, opentelemetry.metrics  # the API, no provider
        from disque.client import tracing
        assert tracing.telemetry() is None
        other = c.add_job("q", b"y")
        (job,) = c.get_jobs("q")
        with c.process(job) as span:
            assert span is None
        print(c.show(job_id).get("headers"), c.show(other).get("headers"), job.trace_context)
    """, address(server))
    assert out.stdout.split("\n")[:2] == ["no", "None None None"]


def test_without_opentelemetry_installed(server: DisqueProcess) -> None:
    out = run_python("""
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed: its imports fail
        from disque import Client
        from disque.client import tracing
        c = Client(sys.argv[1])
        job_id = c.add_job("q", b"x")
        ids = c.add_jobs("q", [b"a"])
        jobs = c.get_jobs("q", count=2)
        with c.process(*jobs) as span:
            assert span is None and tracing.telemetry() is None
        assert c.ack(job_id, *ids) == 2
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry.")))
    """, address(server))
    assert out.stdout.strip() == "[]"


#: A process with the SDK, exporting its spans to a JSON file at exit.
SETUP = """
    import json, sys, atexit
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class JsonExporter(SpanExporter):
        def __init__(self, path):
            self.path, self.spans = path, []
        def export(self, spans):
            for s in spans:
                self.spans.append({
                    "name": s.name, "kind": s.kind.name, "attributes": dict(s.attributes),
                    "trace_id": f"{s.context.trace_id:032x}",
                    "span_id": f"{s.context.span_id:016x}",
                    "parent": f"{s.parent.span_id:016x}" if s.parent else None,
                    "links": [{"trace_id": f"{lk.context.trace_id:032x}",
                               "span_id": f"{lk.context.span_id:016x}",
                               "attributes": dict(lk.attributes)} for lk in s.links]})
            return SpanExportResult.SUCCESS
        def shutdown(self):
            with open(self.path, "w") as f:
                json.dump(self.spans, f)

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonExporter(sys.argv[2])))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)
    from disque import Client
"""


def test_producer_and_worker_processes_share_the_trace(server: DisqueProcess,
                                                        tmp_path: Path) -> None:
    producer_file, worker_file = tmp_path / "producer.json", tmp_path / "worker.json"
    job_id = run_python(SETUP + """
    with Client(sys.argv[1]) as c, trace.get_tracer("producer").start_as_current_span("order"):
        print(c.add_job("work", b"payload", retry=30))
    """, address(server), str(producer_file)).stdout.strip()
    run_python(SETUP + """
    with Client(sys.argv[1]) as c:
        (job,) = c.get_jobs("work", timeout_ms=10000, with_counters=True)
        with c.process(job):
            pass
        c.ack(job.id)
    """, address(server), str(worker_file))
    produced = {s["name"]: s for s in json.loads(producer_file.read_text())}
    worked = {s["name"]: s for s in json.loads(worker_file.read_text())}
    send = produced["send work"]
    assert send["kind"] == "PRODUCER" and send["parent"] == produced["order"]["span_id"]
    assert send["attributes"]["messaging.message.id"] == job_id
    assert set(worked) == {"receive work", "process work", "ack"}
    receive, process = worked["receive work"], worked["process work"]
    assert (receive["kind"], process["kind"], worked["ack"]["kind"]) == (
        "CLIENT", "CONSUMER", "CLIENT")
    for span in (receive, process):
        (link,) = span["links"]
        assert (link["trace_id"], link["span_id"]) == (send["trace_id"], send["span_id"])
        assert link["attributes"]["messaging.message.id"] == job_id
    assert process["parent"] is None  # no ambient context in the worker: a root, linked
    assert process["attributes"]["messaging.disque.message.delivery_count"] == 1
    assert worked["ack"]["attributes"]["messaging.operation.type"] == "settle"


def test_the_docs_set_up_runs(server: DisqueProcess) -> None:
    """docs/TRACING.md's set-up block, as written, against this test's node."""
    text = (ROOT / "docs" / "TRACING.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.startswith("from opentelemetry import metrics, trace")
    out = run_python(block.replace("127.0.0.1:7711", address(server))).stdout
    assert "handling b'payload'" in out
    for name in ("send emails", "receive emails", "process emails", "ack"):
        assert f'"name": "{name}"' in out, name
    for metric in ("messaging.client.operation.duration", "messaging.client.sent.messages",
                   "messaging.client.consumed.messages", "messaging.process.duration"):
        assert f'"name": "{metric}"' in out, metric


def test_traced_jobs_keep_their_groups(otel: Otel, server: DisqueProcess) -> None:
    """Tracing adds the creation context beside the jobs' other options:
    ordered groups (per job and shared) go out as without tracing."""
    with Client(address(server)) as client:
        one = client.add_job("gq", b"a", group="g1")
        ids = client.add_jobs("gq", [b"b", b"c", b"d"], job_groups=["g1", None, "g2"])
        jobs = client.get_jobs("gq", count=10, with_group=True)
        assert {(j.id, j.group) for j in jobs} == {
            (one, "g1"), (ids[0], "g1"), (ids[1], None), (ids[2], "g2")}
        order = [j.id for j in jobs]
        assert order.index(one) < order.index(ids[0])  # g1 in add order
        assert all(j.trace_context for j in jobs)
        assert client.ack(*order) == 4
    assert len(otel.spans("create gq")) == 3
