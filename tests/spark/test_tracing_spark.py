"""OpenTelemetry in the Spark connectors (spark_connector/telemetry.py,
docs/SPARK.md "Job headers and traces", docs/TRACING.md "Spark").

The reader and the partition writer run as plain objects against real
nodes with the real SDK (an in-memory exporter) in this process; then the
whole pipeline of docs/SPARK.md runs across real processes: a producer
adds a job with the client, the docs' Spark script reads it with
``includeHeaders`` and writes it to a second queue (its ``telemetrySetup``
writing each process's spans to files), and a worker processes it with
``parent_from_job=True``, in the producer's trace.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the dev extra: opentelemetry-sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    StringType,
    StructField,
    StructType,
)

from disque.client import Client
from spark_connector import telemetry
from spark_connector.fetch import fetch_jobs
from spark_connector.options import OptionError, SourceConfig
from spark_connector.schema import HEADERS, source_schema
from spark_connector.sink_options import SinkConfig
from spark_connector.stream_reader import DisqueStreamReader
from spark_connector.writer import PartitionWriter
from tests.spark.otel_setup import SPANS_ENV, picture, read_spans
from tests.support.fresh import run_fresh

ROOT = Path(__file__).resolve().parents[2]
DELIVERY_COUNT = "messaging.disque.message.delivery_count"


def _reset_globals() -> None:
    """Forget the global provider (as OpenTelemetry's own test utilities do)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


class Otel:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        (found,) = self.spans(name)
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    _reset_globals()
    o = Otel()
    trace.set_tracer_provider(o.provider)
    yield o
    o.provider.shutdown()
    _reset_globals()
    assert telemetry.tracer() is None


@pytest.fixture
def client(server) -> Iterator[Client]:
    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


def spied_getjobs(monkeypatch) -> list[tuple]:
    """The GETJOB commands sent through ``Client.execute_command`` from now on."""
    sent: list[tuple] = []
    original = Client.execute_command

    def spy(self, *args):
        if args[0] == "GETJOB":
            sent.append(args)
        return original(self, *args)

    monkeypatch.setattr(Client, "execute_command", spy)
    return sent


def context_of(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def common(span: ReadableSpan, operation: str, port: int, queue: str | None) -> None:
    attrs = span.attributes or {}
    assert attrs["messaging.system"] == "disque"
    assert attrs["messaging.operation.name"] == operation
    assert attrs["messaging.operation.type"] == operation
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", port)
    assert attrs.get("messaging.destination.name") == queue
    assert span.instrumentation_scope.name == telemetry.SCOPE


# --------------------------------------------------------------------------
# The source's receive spans
# --------------------------------------------------------------------------

def test_a_fetch_links_each_job_to_its_creation_context(otel: Otel, server, client: Client,
                                                        monkeypatch) -> None:
    job_id = client.add_job("q", b"x", retry=60)  # the client's send span, injected
    send = otel.span("send q")
    plain = client.add_job("q", b"y", headers={"traceparent": "garbage"})
    getjobs = spied_getjobs(monkeypatch)
    fetched = fetch_jobs(client, ["q"], 10, batch_size=10, lease=True)
    # Tracing asks for the headers, but without includeHeaders stages none.
    assert all("WITHHEADERS" in args for args in getjobs)
    assert HEADERS not in fetched.table.column_names and fetched.table.num_rows == 2
    receive = otel.span("receive q")
    assert receive.kind is SpanKind.CLIENT
    common(receive, "receive", server.port, "q")
    assert receive.attributes["messaging.batch.message_count"] == 2
    (link,) = receive.links  # the job without a valid context has none
    assert (link.context.trace_id, link.context.span_id) == context_of(send)
    assert dict(link.attributes) == {"messaging.message.id": job_id,
                                     "messaging.destination.name": "q", DELIVERY_COUNT: 1}
    assert plain in fetched.table.column("id").to_pylist()
    # Dated from the fetch's start, ended when the jobs were known.
    assert receive.start_time <= receive.end_time


def test_links_are_capped_and_an_empty_fetch_makes_no_span(otel: Otel, client: Client) -> None:
    client.add_jobs("q", [b"%d" % i for i in range(telemetry.MAX_LINKS + 5)])
    creates = otel.spans("create q")
    assert len(creates) == telemetry.MAX_LINKS + 5
    fetch_jobs(client, ["q"], None, batch_size=50)
    receive = otel.span("receive q")
    assert receive.attributes["messaging.batch.message_count"] == telemetry.MAX_LINKS + 5
    assert [link.context.span_id for link in receive.links] == [
        c.context.span_id for c in creates[:telemetry.MAX_LINKS]]
    fetch_jobs(client, ["q"], None, batch_size=50)  # nothing left: no span
    assert len(otel.spans("receive q")) == 1
    fetch_jobs(client, ["q", "other"], None, batch_size=50)
    client.add_job("other", b"z")
    fetch_jobs(client, ["q", "other"], None, batch_size=50)
    several = otel.span("receive")  # several queues: no destination in the name
    assert "messaging.destination.name" not in several.attributes


def test_the_stream_reader_traces_its_fetch_once_not_its_replay(otel: Otel, server,
                                                                 client: Client,
                                                                 tmp_path: Path) -> None:
    ids = [client.add_job("q", b"%d" % i) for i in range(3)]
    options = {"nodes": f"127.0.0.1:{server.port}", "queues": "q", "fetchAhead": "false",
               "stagingPath": str(tmp_path / "s"), "fetchTimeoutMs": "0",
               "includeHeaders": "true"}
    config = SourceConfig.from_options(options, streaming=True)
    first = DisqueStreamReader(config, source_schema("binary", True))
    end = first.latestOffset({"batch": 0}, ReadMaxRows(10))
    receive = otel.span("receive q")
    assert [lk.attributes["messaging.message.id"] for lk in receive.links] == ids
    first.driver.keeper.stop()  # crash
    second = DisqueStreamReader(config, source_schema("binary", True))
    rows = [r for p in second.partitions({"batch": 0}, end)
            for b in second.read(pickle.loads(pickle.dumps(p))) for r in b.to_pylist()]
    # The replay comes from staging: no second receive span; the headers
    # the column shows carry the creation contexts the links came from.
    assert len(otel.spans("receive q")) == 1
    assert [dict((h["key"], h["value"]) for h in r["headers"])["traceparent"].decode()
            for r in rows] == [f"00-{lk.context.trace_id:032x}-{lk.context.span_id:016x}-"
                               f"{int(lk.context.trace_flags):02x}" for lk in receive.links]
    second.stop()


def test_executor_fetch_mode_traces_in_the_task(otel: Otel, server, client: Client,
                                                tmp_path: Path) -> None:
    """The fetch runs in the task (an executor's Python worker): its span too."""
    job_id = client.add_job("q", b"x")
    send = otel.span("send q")
    config = SourceConfig.from_options({
        "nodes": f"127.0.0.1:{server.port}", "queues": "q", "fetchMode": "executor",
        "stagingPath": str(tmp_path / "s"), "fetchTimeoutMs": "0",
        "telemetrySetup": "tests.spark.otel_setup:keep"}, streaming=True)
    reader = DisqueStreamReader(config, source_schema())
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    (part,) = reader.partitions({"batch": 0}, end)
    assert part.telemetry_setup == "tests.spark.otel_setup:keep"
    assert otel.spans("receive q") == []  # the driver only planned
    (row,) = [r for b in reader.read(pickle.loads(pickle.dumps(part))) for r in b.to_pylist()]
    receive = otel.span("receive q")
    assert row["id"] == job_id
    assert [lk.context.span_id for lk in receive.links] == [send.context.span_id]
    reader.stop()


# --------------------------------------------------------------------------
# The sink's send spans
# --------------------------------------------------------------------------

ENTRY = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
SCHEMA = StructType([StructField("body", StringType()), StructField("headers", ArrayType(ENTRY))])
ARROW = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def write(port: int, bodies: list[str], headers: list | None = None, *,
          queue: str = "out") -> PartitionWriter:
    schema = SCHEMA if headers is not None else StructType([SCHEMA["body"]])
    config = SinkConfig.from_options({"nodes": f"127.0.0.1:{port}", "queue": queue}, schema)
    arrays = [pa.array(bodies)] + ([pa.array(headers, ARROW)] if headers is not None else [])
    writer = PartitionWriter(config, 0)
    writer.write(iter([pa.RecordBatch.from_arrays(arrays, names=schema.fieldNames())]))
    return writer


def headers_of(client: Client, queue: str) -> dict[bytes, list[bytes]]:
    reply = client.execute_command("GETJOB", "NOHANG", "COUNT", 100, "WITHHEADERS",
                                   "FROM", queue) or []
    return {entry[2]: entry[4] for entry in reply}


def traceparent(span: ReadableSpan) -> bytes:
    return b"00-%032x-%016x-%02x" % (*context_of(span), int(span.context.trace_flags))


def test_the_sink_injects_its_send_span_into_rows_without_a_context(otel: Otel, server,
                                                                    client: Client) -> None:
    write(server.port, ["a", "b"], [None, [{"key": "tenant", "value": b"acme"}]])
    send = otel.span("send out")
    assert send.kind is SpanKind.PRODUCER
    common(send, "send", server.port, "out")
    assert send.attributes["messaging.batch.message_count"] == 2
    assert send.links == () or list(send.links) == []
    assert headers_of(client, "out") == {b"a": [b"traceparent", traceparent(send)],
                                         b"b": [b"tenant", b"acme", b"traceparent",
                                                traceparent(send)]}
    write(server.port, ["c"])  # no headers column at all
    assert headers_of(client, "out") == {b"c": [b"traceparent",
                                                traceparent(otel.spans("send out")[1])]}


def test_rows_with_their_own_context_are_sent_as_given_and_linked(otel: Otel, server,
                                                                  client: Client) -> None:
    mine = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    write(server.port, ["a"], [[{"key": "traceparent", "value": mine},
                                {"key": "x", "value": b"1"}]])
    send = otel.span("send out")
    assert send.kind is SpanKind.CLIENT  # no job's creation context
    (link,) = send.links
    assert (link.context.trace_id, link.context.span_id) == (
        0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7)
    assert headers_of(client, "out") == {b"a": [b"traceparent", mine, b"x", b"1"]}
    # Mixed: PRODUCER, its context in the row that had none, linked to the other.
    write(server.port, ["b", "c"], [[{"key": "traceparent", "value": mine}], None])
    mixed = otel.spans("send out")[1]
    assert mixed.kind is SpanKind.PRODUCER and len(mixed.links) == 1
    assert headers_of(client, "out") == {b"b": [b"traceparent", mine],
                                         b"c": [b"traceparent", traceparent(mixed)]}


def test_grouped_rows_get_the_send_context_and_keep_their_order(otel: Otel, server,
                                                               client: Client) -> None:
    """With a ``group`` column (tests/spark/test_groups_sink.py): the rows
    with a key get the span's context too, now each in an ``ADDJOB ...
    GROUP`` (``ADDJOBS ... GROUPS`` takes no per-job headers), in row order."""
    schema = StructType([StructField("body", StringType()), StructField("group", StringType())])
    config = SinkConfig.from_options({"nodes": f"127.0.0.1:{server.port}", "queue": "out"},
                                     schema)
    writer = PartitionWriter(config, 0)
    writer.write(iter([pa.RecordBatch.from_arrays(
        [pa.array(["a0", "p", "a1", "a2"]), pa.array(["A", None, "A", "A"])],
        names=["body", "group"])]))
    assert writer.sent_single == 3 and writer.sent_bulk == 1
    send = otel.span("send out")
    assert send.attributes["messaging.batch.message_count"] == 4
    reply = client.execute_command("GETJOB", "NOHANG", "COUNT", 100, "WITHHEADERS",
                                   "WITHGROUP", "FROM", "out")
    got = {entry[2]: (entry[4], entry[-1]) for entry in reply}
    assert got == {body: ([b"traceparent", traceparent(send)], group)
                   for body, group in ((b"a0", b"A"), (b"p", None), (b"a1", b"A"),
                                       (b"a2", b"A"))}
    assert [entry[2] for entry in reply if entry[-1] == b"A"] == [b"a0", b"a1", b"a2"]


def test_a_failed_write_ends_its_span_with_the_error(otel: Otel, server, client: Client) -> None:
    client.execute_command("CONFIG", "SET", "max-job-headers", "1")
    with pytest.raises(Exception, match="too many headers"):
        write(server.port, ["a"], [[{"key": "traceparent", "value": b"00-" + b"1" * 32
                                     + b"-" + b"2" * 16 + b"-01"},
                                    {"key": "x", "value": b"y"}]])
    send = otel.span("send out")
    assert send.attributes["error.type"] == "DisqueWriteError"
    assert not send.status.is_ok


def test_a_node_refusing_the_added_context_gets_the_rows_without_it(otel: Otel, server,
                                                                    client: Client) -> None:
    """Ours with max-job-headers 0, as an original node: the client's rule."""
    client.execute_command("CONFIG", "SET", "max-job-headers", "0")
    writer = write(server.port, ["a", "b"])
    assert writer.no_headers and client.qlen("out") == 2
    assert headers_of(client, "out") == {b"a": [], b"b": []}
    assert otel.span("send out").status.is_ok


def test_an_original_node_without_headers(otel: Otel, original) -> None:
    """Tracing against the original: the source fetches without WITHHEADERS
    (no links), the sink adds without the context."""
    with Client(f"127.0.0.1:{original.port}") as c:
        writer = write(original.port, ["a", "b"], queue="q")
        assert writer.no_headers
        fetched = fetch_jobs(c, ["q"], 10, batch_size=10, lease=True)
        assert fetched.table.num_rows == 2 and not fetched.headers_supported
        assert not fetched.lease_supported
        receive = otel.span("receive q")
        assert receive.attributes["messaging.batch.message_count"] == 2
        assert list(receive.links) == []


# --------------------------------------------------------------------------
# telemetrySetup, and nothing without a provider
# --------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["module", ":setup", "module:", "a b:c"])
def test_telemetry_setup_must_name_a_function(value: str) -> None:
    with pytest.raises(OptionError, match="option 'telemetrySetup' must be module:function"):
        SourceConfig.from_options({"queues": "q", "telemetrySetup": value}, streaming=False)


def test_telemetry_setup_runs_once_per_process_and_its_errors_say_so(tmp_path: Path) -> None:
    (tmp_path / "mysetup.py").write_text(textwrap.dedent("""
        calls = []
        def setup():
            calls.append(1)
        def broken():
            raise RuntimeError("no collector configured")
    """))
    out = run_fresh(f"""
import json, sys
sys.path.insert(0, {str(tmp_path)!r})
from spark_connector import telemetry
import mysetup
telemetry.setup("mysetup:setup"); telemetry.setup("mysetup:setup"); telemetry.setup(None)
errors = []
for spec in ("mysetup:broken", "mysetup:broken", "mysetup:missing", "nosuchmodule:setup"):
    try:
        telemetry.setup(spec)
    except Exception as exc:
        errors.append(str(exc))
print(json.dumps({{"calls": len(mysetup.calls), "errors": errors}}))
""")
    assert out["calls"] == 1
    assert out["errors"][0] == out["errors"][1] == (
        "disque data source: option 'telemetrySetup': mysetup:broken raised RuntimeError: "
        "no collector configured")
    assert "names 'missing', which module 'mysetup' does not have" in out["errors"][2]
    assert "names module 'nosuchmodule', which cannot be imported" in out["errors"][3]


def test_without_a_provider_nothing_is_asked_or_added(server, client: Client,
                                                      monkeypatch) -> None:
    assert telemetry.tracer() is None
    getjobs = spied_getjobs(monkeypatch)
    client.add_job("q", b"x")
    fetch_jobs(client, ["q"], 10, batch_size=10)
    assert getjobs and not any("WITHHEADERS" in args for args in getjobs)
    write(server.port, ["a"])
    assert headers_of(client, "out") == {b"a": []}


# --------------------------------------------------------------------------
# Across real processes: producer, the docs' Spark pipeline, worker
# --------------------------------------------------------------------------

def docs_block(first_line: str) -> str:
    text = (ROOT / "docs" / "SPARK.md").read_text()
    for chunk in text.split("```python\n")[1:]:
        code = chunk.split("```", 1)[0]
        if code.startswith(first_line):
            return code
    raise AssertionError(f"docs/SPARK.md has no block starting with {first_line!r}")


def run(code: str, env: dict[str, str], *args: str, timeout: float = 120) -> str:
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def by_name(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [s for s in spans if s["name"] == name]
    return found


def test_a_pipeline_keeps_the_producers_trace_across_processes(server, tmp_path: Path) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    address = f"127.0.0.1:{server.port}"
    env = {**os.environ, SPANS_ENV: str(spans_dir), "DISQUE_NODES": address,
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    job_id = run(textwrap.dedent("""
        import sys
        from opentelemetry import trace
        from tests.spark.otel_setup import setup
        setup()
        from disque import Client
        with Client(sys.argv[1]) as c, trace.get_tracer("producer").start_as_current_span("order"):
            print(c.add_job("orders", b"payload", retry=30))
    """), env, address).strip()

    script = (docs_block('"""Enrich the jobs')
              .replace("myapp.telemetry:setup", "tests.spark.otel_setup:setup")
              .replace("/data/", str(tmp_path) + "/"))
    run(script, env, timeout=600)

    run(textwrap.dedent("""
        import sys
        from tests.spark.otel_setup import setup
        setup()
        from disque import Client
        with Client(sys.argv[1]) as c:
            (job,) = c.get_jobs("orders-enriched", timeout_ms=10000, with_counters=True)
            assert job.body == b"PAYLOAD", job
            with c.process(job, parent_from_job=True):
                pass
            c.ack(job.id)
    """), env, address)

    spans = read_spans(spans_dir)
    send = by_name(spans, "send orders")  # the producer's
    assert send["kind"] == "PRODUCER" and send["parent"] == by_name(spans, "order")["span_id"]
    producer = {"trace_id": send["trace_id"], "span_id": send["span_id"]}

    receive = by_name(spans, "receive orders")  # Spark's fetch
    assert receive["kind"] == "CLIENT" and receive["scope"] == telemetry.SCOPE
    assert receive["attributes"] == {
        "messaging.system": "disque", "messaging.operation.name": "receive",
        "messaging.operation.type": "receive", "messaging.destination.name": "orders",
        "server.address": "127.0.0.1", "server.port": server.port,
        "messaging.batch.message_count": 1}
    (link,) = receive["links"]
    assert {k: link[k] for k in producer} == producer
    assert link["attributes"] == {"messaging.message.id": job_id,
                                  "messaging.destination.name": "orders", DELIVERY_COUNT: 1}

    forward = by_name(spans, "send orders-enriched")  # Spark's write
    assert forward["kind"] == "CLIENT"  # the row carried the producer's context
    assert forward["attributes"]["messaging.batch.message_count"] == 1
    assert forward["attributes"]["server.port"] == server.port
    assert [{k: lk[k] for k in producer} for lk in forward["links"]] == [producer]
    # Each ran in its own Spark process, set up by telemetrySetup there.
    pids = {s["pid"] for s in (send, receive, forward)}
    assert len(pids) == 3

    worked = by_name(spans, "process orders-enriched")  # the worker's
    assert worked["kind"] == "CONSUMER"
    assert worked["trace_id"] == send["trace_id"]  # the producer's trace goes on
    assert worked["parent"] == send["span_id"]
    (got,) = [s for s in spans if s["name"] == "receive orders-enriched"]
    assert [{k: lk[k] for k in producer} for lk in got["links"]] == [producer]

    # docs/TRACING.md's picture of one trace is this test's (pytest -s).
    roles = {send["pid"]: "producer", receive["pid"]: "spark driver",
             forward["pid"]: "spark executor", worked["pid"]: "worker"}
    drawn = picture(spans, roles)
    print(drawn)
    rows = drawn.splitlines()[1:]
    assert len(rows) == len(spans)
    row = next(r for r in rows if "process orders-enriched" in r)
    assert "worker" in row and send["trace_id"][:8] in row and "child of send orders" in row
    row = next(r for r in rows if "receive orders " in r)
    assert "spark driver" in row and "link to send orders" in row


def test_the_docs_set_up_function_runs(tmp_path: Path) -> None:
    """docs/SPARK.md's telemetrySetup function, with an in-memory exporter in
    place of the OTLP one (a collector is not part of the tests)."""
    code = docs_block("# myapp/telemetry.py").replace(
        "from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter",
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter as OTLPSpanExporter")
    out = run_fresh(code + textwrap.dedent("""
        import json
        from spark_connector import telemetry
        setup()
        found = telemetry.tracer()
        print(json.dumps({"tracing": found is not None,
                          "service": found.provider.resource.attributes["service.name"]}))
    """))
    assert out == {"tracing": True, "service": "enrich-orders"}
