"""What the source loads in the Python processes Spark starts for it.

Spark unpickles the data source in a fresh process for ``schema()`` at every
``load()``, and the driver side of every streaming query runs in a new
Python process: each module loaded there is paid per query, on the way to
its first batch.  These tests run a fresh interpreter (the state those
processes start from: pyspark loaded, nothing else) and check that

* asking for the schema loads neither redis-py (through ``disque.client``)
  nor pyarrow;
* the driver side of a whole drain (fetch, stage, lease, partitions, the
  executor's read, ACK, the empty closing batch) never loads pandas, which
  pyarrow loads the first time ``pa.array`` gets a list or ``pa.scalar`` a
  value: 0.2-0.4 s in a process that lives for one query, nor
  ``pyarrow.compute``, which the first ``cast`` loads (it wraps every
  compute kernel: 0.06-0.15 s), nor the asyncio client
  (``disque.client.aio``);
* neither does a batch ``spark.read`` (peek or drain) in the executor's
  Python worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fresh import run_fresh

LOADED = ("redis", "disque.client", "pyarrow", "pandas")


def test_schema_loads_neither_the_client_nor_arrow() -> None:
    out = run_fresh(f"""
import json, pickle, sys
import pyspark.sql.worker.create_data_source  # what Spark's process has loaded
from spark_connector.source import DisqueDataSource
source = pickle.loads(pickle.dumps(DisqueDataSource({{"queues": "q", "bodyFormat": "string"}})))
schema = source.schema()
print(json.dumps({{"fields": schema.fieldNames(),
                  "loaded": [m for m in {LOADED!r} if m in sys.modules]}}))
""")
    assert out["fields"] == ["queue", "id", "body", "nacks", "additional_deliveries", "node",
                             "fetched_at"]
    assert out["loaded"] == []


@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_a_drain_on_the_driver_side_never_loads_pandas(server, tmp_path: Path,
                                                       fetch_mode: str) -> None:
    """Executor mode too: its ACK reads each batch's part files back
    (StagingArea.read_batch), which once started from Schema.empty_table()."""
    from disque.client import Client

    with Client(f"127.0.0.1:{server.port}") as client:
        client.add_jobs("q", [b"job-%d" % i for i in range(2500)])
        # One job delivered before (then queued again without a NACK): the
        # redelivery counter's path runs too.
        client.enqueue(*[job.id for job in client.get_jobs("q", count=1)])
    out = run_fresh(f"""
import json, pickle, sys
from pyspark.sql.streaming.datasource import ReadMaxRows
from spark_connector.source import DisqueDataSource
source = DisqueDataSource({{"nodes": "127.0.0.1:{server.port}", "queues": "q",
                          "stagingPath": {str(tmp_path / "staging")!r}, "fetchTimeoutMs": "0",
                          "maxJobsPerTrigger": "1000", "fetchMode": {fetch_mode!r}}})
reader = source.streamReader(source.schema())
reader.prepareForTriggerAvailableNow()
start, rows, batches = reader.initialOffset(), 0, 0
while True:
    # Spark's order: the batch ending at ``start`` is in the commit log when
    # it asks for the next offset (the source acknowledges it there); the
    # source's commit() of it comes only once a new batch is logged.
    end = reader.latestOffset(start, ReadMaxRows(1000))
    if end == start:
        break
    if batches:
        reader.commit(start)
    for part in reader.partitions(start, end):
        for batch in reader.read(pickle.loads(pickle.dumps(part))):
            rows += batch.num_rows
    start, batches = end, batches + 1
metrics = reader.reportLatestOffset()
reader.stop()
print(json.dumps({{"rows": rows, "batches": batches, "acked": metrics["jobsAcked"],
                  "redelivered": metrics["redeliveredSeen"],
                  "pandas": "pandas" in sys.modules,
                  "compute": "pyarrow.compute" in sys.modules,
                  "aio": "disque.client.aio" in sys.modules}}))
""")
    assert out["rows"] == out["acked"] == 2500
    if fetch_mode == "driver":  # executor mode plans from QLEN and counts on the executors
        assert out["batches"] == 4  # three of 1000, 1000, 500, then the empty closing batch
        assert out["redelivered"] == 1
    assert out["pandas"] is False
    assert out["compute"] is False
    assert out["aio"] is False  # the sync client only (tests/client/test_imports.py)


@pytest.mark.parametrize("drain", ["false", "true"])
def test_a_batch_read_never_loads_pandas(server, drain: str) -> None:
    """``spark.read.format("disque")``: the executor's Python worker peeks
    (JSCAN, ``fetch.jobs_to_table``) or drains (GETJOB) without pandas."""
    from disque.client import Client

    with Client(f"127.0.0.1:{server.port}") as client:
        client.add_jobs("q", [b"job-%d" % i for i in range(300)])
    out = run_fresh(f"""
import json, pickle, sys
from spark_connector.source import DisqueDataSource
source = DisqueDataSource({{"nodes": "127.0.0.1:{server.port}", "queues": "q",
                          "drain": {drain!r}}})
reader = source.reader(source.schema())
rows, ids = 0, set()
for part in reader.partitions():
    for batch in reader.read(pickle.loads(pickle.dumps(part))):
        rows += batch.num_rows
        ids.update(batch.column("id").to_pylist())
print(json.dumps({{"rows": rows, "ids": len(ids), "pandas": "pandas" in sys.modules,
                  "compute": "pyarrow.compute" in sys.modules}}))
""")
    assert out == {"rows": 300, "ids": 300, "pandas": False, "compute": False}
    with Client(f"127.0.0.1:{server.port}") as client:
        assert client.qlen("q") == (0 if drain == "true" else 300)


def test_jobs_to_table_equals_pa_array_columns() -> None:
    import pyarrow as pa

    from disque.client import Job
    from spark_connector.fetch import jobs_to_table
    from spark_connector.schema import STAGED_SCHEMA

    jobs = [Job("q", "D-1", b"a", 0, 0), Job("é", "D-2", b"", 2, None),
            Job("q", "D-3", b"\x00\xff" * 300, None, 5)]
    expected = pa.Table.from_arrays([
        pa.array([j.queue for j in jobs], pa.string()),
        pa.array([j.id for j in jobs], pa.string()),
        pa.array([j.body for j in jobs], pa.binary()),
        pa.array([j.nacks or 0 for j in jobs], pa.int64()),
        pa.array([j.additional_deliveries or 0 for j in jobs], pa.int64()),
        pa.array([1_700_000_000_000_000] * len(jobs), pa.timestamp("us", tz="UTC")),
    ], schema=STAGED_SCHEMA)
    assert jobs_to_table(jobs, 1_700_000_000_000_000).equals(expected)
    assert jobs_to_table([], 0).equals(expected.slice(0, 0))


def test_columns_built_from_buffers_equal_pa_array() -> None:
    import pyarrow as pa

    from spark_connector.fetch import binary_array, int64_array

    for values in ([], [b""], [b"a", b"", "é".encode(), b"\x00\xff" * 300]):
        assert binary_array(values).equals(pa.array(values, pa.binary()))
    for numbers in ([], [0], [3, 0, 2**40]):
        assert int64_array(numbers).equals(pa.array(numbers, pa.int64()))


def test_string_columns_without_cast_check_utf8_as_the_cast_does() -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_connector.fetch import binary_ids, count_nonzero, string_array
    from spark_connector.schema import node_prefixes

    names = [b"q", b"", "é".encode(), b"D-0f1e2d3c-abcdef-SQ"]
    assert string_array(names).equals(pa.array(names, pa.binary()).cast(pa.string()))
    with pytest.raises(pa.ArrowInvalid):
        string_array([b"ok", b"\xff\xfe"])
    column = pa.chunked_array([string_array(names[2:]), string_array(names[:3]).slice(1)])
    assert binary_ids(column) == names[2:] + names[1:3]
    numbers = pa.chunked_array([pa.array([0, 3, 0, 1]).slice(1), pa.array([], pa.int64()),
                                pa.array([2, 0])])
    assert count_nonzero(numbers) == 3
    with pytest.raises(TypeError):
        count_nonzero(pa.chunked_array([pa.array([1, None])]))
    # Node IDs (ASCII, D-<8 hex>-...), and what no node makes: shorter than
    # the prefix, or not ASCII (characters are not bytes there).
    ids = pa.chunked_array([
        pa.array(["D-0f1e2d3c-abc-SQ", "D-aaaaaaaa-1"]).slice(1),
        pa.array([], pa.string()),
        pa.array(["D-é1234567-x", "short", "D-12345678-z"]),
    ])
    assert node_prefixes(ids).to_pylist() == pc.utf8_slice_codeunits(ids, 2, 10).to_pylist()
    assert node_prefixes(ids).to_pylist() == ["aaaaaaaa", "é1234567", "ort", "12345678"]
    large = ids.cast(pa.large_string())  # 64-bit offsets: Arrow's slice, same prefixes
    assert node_prefixes(large).to_pylist() == ["aaaaaaaa", "é1234567", "ort", "12345678"]
