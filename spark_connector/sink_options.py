"""Options and input schema of the ``disque`` sink, checked once on the driver.

``df.write.format("disque")`` and ``df.writeStream.format("disque")`` build
their writer on the driver before any task runs.  Everything that can be
known there is checked there: option values (with the helpers of
:mod:`.options`, so errors look the same as the source's) and the
DataFrame's columns.  A typo in a column name or an option fails the write
with an error naming it, before a single job was added; nothing is
silently ignored, since an ignored ``ttl`` column would only show up as
jobs expiring at the wrong time, much later.

The result is a :class:`SinkConfig`: frozen, picklable, shipped to every
task with the writer.  See docs/SPARK_SINK.md for the user-facing tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .options import (
    ConnectionConfig,
    OptionError,
    option_bool,
    option_choice,
    option_duration_ms,
    option_int,
    option_str,
    option_telemetry_setup,
)

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "SchemaError", "SinkColumns", "SinkConfig", "validate_schema",
    "RETRYABLE_ERRORS", "DEFAULT_RETRY_ERRORS", "KEY_COLUMN", "JOB_OPTION_COLUMNS",
    "JOB_OPTION_MAXIMUMS", "HEADERS_COLUMN", "GROUP_COLUMN",
]

#: The column that carries a caller-chosen dedup key (see docs/SPARK_SINK.md).
KEY_COLUMN = "_disque_key"
#: The column of each job's headers (the source's ``includeHeaders`` column).
HEADERS_COLUMN = "headers"
_HEADERS_TYPES = ("array<struct<key: string, value: binary or string>> (the source's "
                  "includeHeaders column, Kafka's headers) or map<string, binary or string>")
#: The column of each job's ordered group key (the source's ``includeGroups``
#: column): ``ADDJOB ... GROUP key``; null: no group.
GROUP_COLUMN = "group"
#: The node's limits for ADDJOB ... IDMP key IDMP-WINDOW s (disque/idmp.py).
MAX_IDMP_KEY_BYTES = 256
MAX_IDMP_WINDOW_S = 86400

#: Per-row ADDJOB options a column may carry, with the smallest value the
#: server accepts (TTL and REPLICATE of 0 make no sense; the server refuses them).
JOB_OPTION_COLUMNS: dict[str, int] = {"delay": 0, "retry": 0, "ttl": 1, "replicate": 1,
                                      "priority": 0}
#: The largest value of the per-row options that have one.
JOB_OPTION_MAXIMUMS: dict[str, int] = {"priority": 31}
#: What each per-row option counts, for the errors.
_OPTION_UNITS = {"replicate": "number of copies", "priority": "priority (0 to 31)"}

#: HELLO priorities from this one on (``fail?``, failed, leaving) are no
#: group's home: the client's rule (``disque.client._cluster.PFAIL_PRIORITY``).
HOME_PRIORITY = 10

#: Failure kinds ``retryErrors`` may name: error reply codes, plus CONNECTION
#: (no node reachable, or the connection dropped mid-pipeline).
RETRYABLE_ERRORS = frozenset(
    {"PAUSED", "NOREPL", "OOM", "LOADING", "LEAVING", "MAXLEN", "MISCONF", "CONNECTION"})

#: Transient by nature: a paused queue gets unpaused, replication catches up,
#: memory is freed as consumers ACK, a loading or leaving node is replaced.
#: MAXLEN and MISCONF are not in the default set: a queue at its MAXLEN is the
#: limit the user asked for, and a node that cannot write its AOF needs a human.
DEFAULT_RETRY_ERRORS = frozenset({"PAUSED", "NOREPL", "OOM", "LOADING", "LEAVING", "CONNECTION"})


class SchemaError(ValueError):
    """The DataFrame written to the sink has a column the sink cannot use."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(f"disque sink: column '{column}' {message}")
        self.column = column


@dataclass(frozen=True)
class SinkColumns:
    """Where each input lives: the DataFrame's own column names, or None.

    Names are matched case-insensitively (as Spark resolves columns) but the
    actual name is kept, since Arrow batches are indexed by it.
    """

    body: str
    body_is_string: bool
    queue: str | None = None
    delay: str | None = None
    retry: str | None = None
    ttl: str | None = None
    replicate: str | None = None
    priority: str | None = None
    key: str | None = None
    #: ``headers``: array<struct<key, value>> or map<string, value>, value
    #: binary or string (sent as UTF-8); null or empty: no headers.
    headers: str | None = None
    #: ``group``: string, the job's ordered group key; null: no group.
    group: str | None = None

    @property
    def per_row_options(self) -> tuple[tuple[str, str], ...]:
        """``(ADDJOB option, column)`` for each per-row option column present."""
        return tuple((name, column) for name in JOB_OPTION_COLUMNS
                     if (column := getattr(self, name)) is not None)


def _type_name(data_type: DataType) -> str:
    return data_type.simpleString()


def validate_schema(schema: StructType) -> SinkColumns:
    """Map the DataFrame's columns to job fields, or raise :class:`SchemaError`."""
    from pyspark.sql.types import (
        BinaryType,
        ByteType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
    )

    integers = (ByteType, ShortType, IntegerType, LongType)
    accepted = ("body", "queue", *JOB_OPTION_COLUMNS, KEY_COLUMN, HEADERS_COLUMN, GROUP_COLUMN)
    found: dict[str, str] = {}
    for field in schema.fields:
        role = field.name.lower()
        if role not in accepted:
            raise SchemaError(field.name, "is not a job field; the sink accepts only "
                              f"{', '.join(accepted)} (select or drop the other columns)")
        if role in found:
            raise SchemaError(field.name, f"appears twice (also as '{found[role]}')")
        found[role] = field.name
        data_type = field.dataType
        if role == "body":
            if not isinstance(data_type, BinaryType | StringType):
                raise SchemaError(field.name, "must be binary or string, got "
                                  + _type_name(data_type))
        elif role in ("queue", KEY_COLUMN, GROUP_COLUMN):
            if not isinstance(data_type, StringType):
                raise SchemaError(field.name, f"must be a string, got {_type_name(data_type)}")
        elif role == HEADERS_COLUMN:
            if not _headers_type(data_type):
                raise SchemaError(field.name, f"must be {_HEADERS_TYPES}, got "
                                  + _type_name(data_type))
        elif not isinstance(data_type, integers):
            raise SchemaError(field.name, "must be an integer (tinyint, smallint, int or "
                              f"bigint) {_OPTION_UNITS.get(role, 'number of seconds')}"
                              f", got {_type_name(data_type)}")
    if "body" not in found:
        raise SchemaError("body", "is required (binary or string): the job body; got columns "
                          + (", ".join(schema.fieldNames()) or "none"))
    body_field = schema[found["body"]]
    return SinkColumns(
        body=found["body"],
        body_is_string=isinstance(body_field.dataType, StringType),
        queue=found.get("queue"),
        delay=found.get("delay"),
        retry=found.get("retry"),
        ttl=found.get("ttl"),
        replicate=found.get("replicate"),
        priority=found.get("priority"),
        key=found.get(KEY_COLUMN),
        headers=found.get(HEADERS_COLUMN),
        group=found.get(GROUP_COLUMN),
    )


def _headers_type(data_type: DataType) -> bool:
    """array<struct<key: string, value: binary|string>> or map<string, binary|string>."""
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

    values = (BinaryType, StringType)
    if isinstance(data_type, MapType):
        return (isinstance(data_type.keyType, StringType)
                and isinstance(data_type.valueType, values))
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name.lower(): f.dataType for f in data_type.elementType.fields}
    return (len(fields) == 2 and isinstance(fields.get("key"), StringType)
            and isinstance(fields.get("value"), values))


def _retry_errors(options: Mapping[str, str]) -> frozenset[str]:
    raw = option_str(options, "retryErrors")
    if raw is None:
        return DEFAULT_RETRY_ERRORS
    if raw.lower() == "none":
        return frozenset()
    names = frozenset(part.strip().upper() for part in raw.split(",") if part.strip())
    unknown = sorted(names - RETRYABLE_ERRORS)
    if unknown:
        raise OptionError("retryErrors", f"has unknown error kinds {', '.join(unknown)}; "
                          f"choose from {', '.join(sorted(RETRYABLE_ERRORS))} or none")
    return names


@dataclass(frozen=True)
class SinkConfig:
    """Options of ``df.write`` / ``df.writeStream`` ``.format("disque")``, validated.

    Job option defaults (``delay``, ``retry``, ``ttl`` in seconds,
    ``replicate``) are ``None`` when not set: ADDJOB then carries no such
    argument and the node applies its own default, exactly as with the
    client library.
    """

    connection: ConnectionConfig
    columns: SinkColumns
    queue: str | None = None
    timeout_ms: int = 5000
    replicate: int | None = None
    delay: int | None = None
    retry: int | None = None
    ttl: int | None = None
    #: ADDJOB ... PRIORITY (an extension, 0 to 31); None: not sent.
    priority: int | None = None
    maxlen: int | None = None
    async_: bool = False
    batch_size: int = 1000
    max_retries: int = 10
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 5000
    retry_errors: frozenset[str] = DEFAULT_RETRY_ERRORS
    dedup_key: bool = False
    write_id: str | None = None
    #: Send the dedup key as ADDJOB's IDMP (extension): "auto" when the node
    #: supports it, "true" always (a node without it fails the task), "false" never.
    idmp: str = "auto"
    #: IDMP-WINDOW seconds (None: the node's default, 300 s).
    idmp_window_s: int | None = None
    #: Partitions spread over the first ``spread`` of ``connection.nodes``;
    #: the others are only fallbacks (None: over all of them).
    spread: int | None = None
    #: ``(node ID, address)`` of the nodes a ``group`` column's rows may
    #: go to, their home by the key's rendezvous ranking (the client's
    #: rule: the nodes HELLO lists not failing nor leaving); empty: each
    #: partition's own node (nodes not discovered, ``discoverNodes=false``).
    group_homes: tuple[tuple[str, str], ...] = ()
    #: ``telemetrySetup``: ``module:function`` called once per Python
    #: process before its first span (:mod:`.telemetry`).
    telemetry_setup: str | None = None

    def over_cluster(self) -> SinkConfig:
        """This config with the cluster's nodes, found through HELLO on the driver.

        Partitions spread over the nodes with the best HELLO priority
        (reachable ones); nodes flagged as failing (``fail?``) are kept as
        fallbacks; failed and leaving ones are left out. When no seed
        answers, the seeds are used as given: the tasks then retry them for
        ``reconnectTimeout`` (the driver must not fail a streaming commit
        for a node that is briefly down).
        """
        from dataclasses import replace

        from .topology import discover

        views = discover(self.connection)
        if not views:
            return self
        best = min(v.priority for v in views)
        nodes = tuple(v.address for v in views)
        homes = tuple((v.node_id, v.address) for v in views
                      if v.node_id is not None and v.priority < HOME_PRIORITY)
        return replace(self, connection=replace(self.connection, nodes=nodes),
                       spread=sum(1 for v in views if v.priority == best),
                       group_homes=homes if self.columns.group is not None else ())

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: StructType, *,
                     overwrite: bool = False, streaming: bool = False) -> SinkConfig:
        if overwrite:
            # A queue cannot be replaced atomically, and complete output mode
            # would re-add the whole result table as new jobs at every trigger.
            what = ('outputMode("complete")' if streaming else 'mode("overwrite")')
            raise OptionError("mode", f"{what} is not supported: the disque sink only adds "
                              "jobs; use " + ('outputMode("append") or "update"' if streaming
                                              else 'mode("append")'))
        columns = validate_schema(schema)
        queue = option_str(options, "queue")
        if queue is None and columns.queue is None:
            raise OptionError("queue", "is required unless the DataFrame has a 'queue' column")
        delay = option_int(options, "delay", None, minimum=0)
        ttl = option_int(options, "ttl", None, minimum=1)
        if delay is not None and ttl is not None and delay >= ttl:
            raise OptionError("delay", f"({delay} s) must be shorter than ttl ({ttl} s)")
        backoff = option_duration_ms(options, "retryBackoff", 100, minimum=1)
        backoff_max = option_duration_ms(options, "retryBackoffMax", 5000, minimum=1)
        assert backoff is not None and backoff_max is not None
        if backoff_max < backoff:
            raise OptionError("retryBackoffMax", f"({backoff_max} ms) must be at least "
                              f"retryBackoff ({backoff} ms)")
        dedup_raw = option_str(options, "dedupKey")
        dedup = option_bool(options, "dedupKey", columns.key is not None)
        if columns.key is not None and dedup_raw is not None and not dedup:
            raise OptionError("dedupKey", f"is false but the DataFrame has a '{KEY_COLUMN}' "
                              "column; drop the column or set dedupKey to true")
        idmp = option_choice(options, "idmp", ("auto", "true", "false"), "auto")
        if idmp == "true" and not dedup:
            raise OptionError("idmp", "is true but there is no dedup key: set dedupKey to "
                              f"true or add a '{KEY_COLUMN}' column")
        window_ms = option_duration_ms(options, "idmpWindow", None, minimum=1000)
        if window_ms is not None and window_ms > MAX_IDMP_WINDOW_S * 1000:
            raise OptionError("idmpWindow", f"must be at most {MAX_IDMP_WINDOW_S} s (a day), "
                              f"got {option_str(options, 'idmpWindow')!r}")
        write_id = option_str(options, "writeId")
        if write_id is not None and ("\n" in write_id or "/" in write_id):
            raise OptionError("writeId", f"must not contain '/' or a newline, got {write_id!r}")
        return cls(
            connection=ConnectionConfig.from_options(options),
            columns=columns,
            queue=queue,
            timeout_ms=option_duration_ms(options, "timeoutMs", 5000) or 0,
            replicate=option_int(options, "replicate", None, minimum=1),
            delay=delay,
            retry=option_int(options, "retry", None, minimum=0),
            ttl=ttl,
            priority=option_int(options, "priority", None, minimum=0,
                                maximum=JOB_OPTION_MAXIMUMS["priority"]),
            maxlen=option_int(options, "maxlen", None, minimum=1),
            async_=option_bool(options, "async", False),
            batch_size=option_int(options, "batchSize", 1000, minimum=1,
                                  maximum=100_000) or 1000,
            max_retries=option_int(options, "maxRetries", 10, minimum=0) or 0,
            retry_backoff_ms=backoff,
            retry_backoff_max_ms=backoff_max,
            retry_errors=_retry_errors(options),
            dedup_key=dedup,
            write_id=write_id,
            idmp=idmp,
            idmp_window_s=window_ms // 1000 if window_ms is not None else None,
            telemetry_setup=option_telemetry_setup(options),
        )
