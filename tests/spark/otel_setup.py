"""The tracing tests' ``telemetrySetup`` function, and what reads its output.

``setup()`` gives the calling process an OpenTelemetry SDK whose spans go,
one JSON object a line, to ``$DISQUE_TEST_SPANS/<pid>.jsonl``.  Each span is
written as it ends (``SimpleSpanProcessor``): Spark ends its Python workers
with ``os._exit``, which runs no exit hook.  The producer and worker
processes of the tests call it too, so every process of a pipeline writes
its spans to the same directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["setup", "keep", "record", "read_spans", "picture", "SPANS_ENV"]

#: The directory the spans go to (one file per process).
SPANS_ENV = "DISQUE_TEST_SPANS"


def record(span: Any) -> dict[str, Any]:
    """A finished SDK span as a JSON-able dict."""
    return {
        "name": span.name, "kind": span.kind.name, "attributes": dict(span.attributes or {}),
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
        "parent_trace": f"{span.parent.trace_id:032x}" if span.parent else None,
        "links": [{"trace_id": f"{link.context.trace_id:032x}",
                   "span_id": f"{link.context.span_id:016x}",
                   "attributes": dict(link.attributes or {})} for link in span.links],
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
        "pid": os.getpid(),
        "start": span.start_time, "end": span.end_time,
    }


def setup() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    path = Path(os.environ[SPANS_ENV]) / f"{os.getpid()}.jsonl"

    class JsonLines(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            with open(path, "a") as out:
                for span in spans:
                    out.write(json.dumps(record(span)) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines()))
    trace.set_tracer_provider(provider)


def keep() -> None:
    """A set-up that leaves the process's provider as it is: for tests that
    run the connector in their own process, whose provider is set already."""


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span the processes wrote to ``directory``."""
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def picture(spans: list[dict[str, Any]], roles: dict[int, str]) -> str:
    """The spans of a pipeline as a text timeline (docs/TRACING.md shows one):
    one line per span in start order, with its process (``roles``: pid to
    a name), its trace (the first 8 hex digits), its offset from the first
    span's start, its duration, and what it is a child of or linked to."""
    names = {s["span_id"]: s["name"] for s in spans}
    start = min(s["start"] for s in spans)
    lines = [f"{'at':>9}  {'process':<15}{'trace':<10}{'span':<26}{'kind':<10}"
             f"{'took':>9}  relation"]
    for s in sorted(spans, key=lambda s: s["start"]):
        relation = []
        if s["parent"] in names:
            relation.append(f"child of {names[s['parent']]}")
        for link in s["links"]:
            relation.append(f"link to {names.get(link['span_id'], link['span_id'])}")
        lines.append(f"{(s['start'] - start) / 1e9:>+8.3f}s  {roles.get(s['pid'], '?'):<15}"
                     f"{s['trace_id'][:8]:<10}{s['name']:<26}{s['kind']:<10}"
                     f"{(s['end'] - s['start']) / 1e6:>7.1f}ms  {', '.join(relation)}".rstrip())
    return "\n".join(lines)
