"""Data source options, parsed once on the driver into typed, validated configs.

Spark hands a data source its options as a case-insensitive ``str -> str``
mapping.  Everything the connector reads from it goes through this module, so
that a typo or a bad value fails the query *before* anything touches a queue,
with an error that names the option, the value and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from disque.client import Client

__all__ = [
    "OptionError", "ConnectionConfig", "SourceConfig", "DEFAULT_MAX_JOBS_PER_TRIGGER",
    "option_str", "option_int", "option_bool", "option_duration_ms", "option_choice",
    "option_telemetry_setup",
]

#: Spark-style durations: "500ms", "30s", "5m", "1h", or a bare number of ms.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h)?\s*$", re.IGNORECASE)
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000,
            "h": 3_600_000}


#: A batch's jobs are held in the driver's memory while staged: a ceiling
#: that catches typos (an extra zero or three) before they cost an OOM.
MAX_JOBS_PER_BATCH = 10_000_000
#: Without maxJobsPerTrigger a batch holds at most this many jobs: every job
#: of a batch sits in the driver's memory while it is staged.
DEFAULT_MAX_JOBS_PER_TRIGGER = 100_000
#: A batch gets at least ceil(jobs / this) Spark partitions (``jobsPerPartition``).
DEFAULT_JOBS_PER_PARTITION = 25_000


class OptionError(ValueError):
    """A data source option is missing or has a bad value."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"disque data source: option '{name}' {message}")
        self.option = name


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup, like Spark's own option maps."""
    value = options.get(name)
    if value is None:
        wanted = name.lower()
        for key, candidate in options.items():
            if key.lower() == wanted:
                return candidate
    return value


def option_str(options: Mapping[str, str], name: str, default: str | None = None,
               *, required: bool = False) -> str | None:
    value = _get(options, name)
    if value is None or value.strip() == "":
        if required:
            raise OptionError(name, "is required")
        return default
    return value.strip()


def option_int(options: Mapping[str, str], name: str, default: int | None,
               *, minimum: int | None = None, maximum: int | None = None) -> int | None:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(name, f"must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise OptionError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise OptionError(name, f"must be <= {maximum}, got {value}")
    return value


def option_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise OptionError(name, f"must be true or false, got {raw!r}")


def option_duration_ms(options: Mapping[str, str], name: str, default: int | None,
                       *, minimum: int = 0) -> int | None:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    match = _DURATION.match(raw)
    if not match:
        raise OptionError(name, f"must be a duration like 500ms, 30s, 5m or 1h, got {raw!r}")
    unit = match.group(2).lower() if match.group(2) else None
    value = int(float(match.group(1)) * _UNIT_MS[unit])
    if value < minimum:
        raise OptionError(name, f"must be at least {minimum} ms, got {raw!r}")
    return value


def option_choice(options: Mapping[str, str], name: str, choices: tuple[str, ...],
                  default: str) -> str:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise OptionError(name, f"must be one of {', '.join(choices)}, got {raw!r}")
    return value


def option_telemetry_setup(options: Mapping[str, str]) -> str | None:
    """``telemetrySetup``: ``module:function`` (checked for its shape here;
    imported where it runs, :func:`.telemetry.setup`)."""
    raw = option_str(options, "telemetrySetup")
    if raw is None:
        return None
    module, sep, name = raw.partition(":")
    if not sep or not module.strip() or not name.strip() or " " in raw:
        raise OptionError("telemetrySetup", f"must be module:function (a function the "
                          f"connector calls to set up OpenTelemetry), got {raw!r}")
    return raw


#: How long an unreachable node is tried again before giving up (source and
#: sink alike): the Python client's own default, long enough for a node to
#: restart, short enough that a wrong address fails the job soon.
DEFAULT_RECONNECT_TIMEOUT_MS = 10_000


def _split_list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach the Disque cluster (shared by the source and the sink).

    ``nodes`` is the seed list ("host:port,host:port"); the client learns the
    rest of the cluster from HELLO.

    ``discover_nodes`` (option ``discoverNodes``, default true): the source
    fetches from, and the sink writes to, every usable node of the cluster,
    found through HELLO; false limits both to the seeds.

    ``reconnect_timeout_s`` (option ``reconnectTimeout``) is the one rule for
    a node that cannot be reached, for the source and the sink alike: it is
    tried again (with a backoff) for that long, so a restarting node is
    waited for, and then the operation gives up naming the node.
    """

    nodes: tuple[str, ...] = ("127.0.0.1:7711",)
    password: str | None = None
    #: The user to authenticate as (option ``user``; users are an extension
    #: of this server); None: the default user, whose password is requirepass.
    user: str | None = None
    connect_timeout_s: float = 2.0
    socket_timeout_s: float = 30.0
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_MS / 1000
    #: Use every node HELLO lists, not only the seeds (option ``discoverNodes``).
    discover_nodes: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ConnectionConfig:
        raw = option_str(options, "nodes", "127.0.0.1:7711")
        assert raw is not None
        nodes = _split_list(raw)
        if not nodes:
            raise OptionError("nodes", f"must list at least one host:port, got {raw!r}")
        # Imported here, not with the module: disque.client loads redis-py
        # (0.25 s), and Spark's process that only asks for the schema
        # imports this module too.
        from disque.client import parse_address

        for node in nodes:
            try:
                parse_address(node)
            except ValueError as exc:
                raise OptionError("nodes", f"has a bad address {node!r}: {exc}") from None
        connect_ms = option_int(options, "connectTimeoutMs", 2000, minimum=1)
        socket_ms = option_int(options, "socketTimeoutMs", 30_000, minimum=1)
        reconnect_ms = option_duration_ms(options, "reconnectTimeout",
                                          DEFAULT_RECONNECT_TIMEOUT_MS)
        assert connect_ms is not None and socket_ms is not None and reconnect_ms is not None
        password = option_str(options, "password")
        user = option_str(options, "user")
        if user is not None and password is None:
            raise OptionError("user", "needs the password option (AUTH user password)")
        return cls(tuple(nodes), password, user, connect_ms / 1000, socket_ms / 1000,
                   reconnect_ms / 1000, option_bool(options, "discoverNodes", True))

    def client(self, *, node: str | None = None, client_name: str = "spark-disque",
               reconnect_timeout_s: float | None = None,
               fallbacks: tuple[str, ...] = ()) -> Client:
        """A new synchronous client (seeded with ``node`` only, when given).

        ``fallbacks`` are tried, in order, when ``node`` does not answer.
        It searches for a reachable node for ``reconnect_timeout_s``
        (default: the ``reconnectTimeout`` option) before raising
        ConnectionFailed.
        """
        from disque.client import Client

        if reconnect_timeout_s is None:
            reconnect_timeout_s = self.reconnect_timeout_s
        seeds = ",".join([node, *fallbacks]) if node else ",".join(self.nodes)
        return Client(seeds, password=self.password, username=self.user,
                      randomize=not (node and fallbacks),
                      connect_timeout=self.connect_timeout_s,
                      socket_timeout=self.socket_timeout_s, client_name=client_name,
                      reconnect_timeout=reconnect_timeout_s)


#: Options named ``staging.<argument>`` configure the staging filesystem.
STAGING_OPTION_PREFIX = "staging."


def _prefixed(options: Mapping[str, str], prefix: str) -> tuple[tuple[str, str], ...]:
    """``(name, value)`` of the options named ``<prefix><name>``, sorted."""
    return tuple(sorted((key[len(prefix):], value) for key, value in options.items()
                        if key.lower().startswith(prefix) and len(key) > len(prefix)))


#: The server's default dead-letter queue suffix (ADDJOB ... MAXDELIVERIES).
DEAD_SUFFIX = ":dead"


def _dead_letter_queues(raw: str | None, queues: tuple[str, ...]) -> tuple[str, ...]:
    """``deadLetterQueues``: unset, ``default`` (``<queue>:dead`` of each
    queue) or a comma-separated list of queue names."""
    if raw is None:
        return ()
    if raw.strip().lower() == "default":
        return tuple(q + DEAD_SUFFIX for q in queues)
    names = tuple(dict.fromkeys(_split_list(raw)))
    if not names:
        raise OptionError("deadLetterQueues",
                          f"must be 'default' or queue names, got {raw!r}")
    return names


@dataclass(frozen=True)
class SourceConfig:
    """Options of ``spark.readStream.format("disque")`` / ``spark.read.format("disque")``.

    See docs/SPARK.md for what each one does; the defaults favour safety
    (ACKJOB, not FASTACK) and an idle queue that costs almost nothing.
    """

    connection: ConnectionConfig
    queues: tuple[str, ...]
    #: Absolute (made so on the driver) or a URI, see :mod:`.stores`.
    staging_path: str | None
    body_format: Literal["binary", "string"] = "binary"
    ack_mode: Literal["ackjob", "fastack"] = "ackjob"
    fetch_mode: Literal["driver", "executor"] = "driver"
    max_jobs_per_trigger: int | None = None
    min_jobs_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    fetch_batch_size: int = 1000
    fetch_timeout_ms: int = 500
    num_partitions: int = 1
    #: 25 000, not 10 000: each Spark task has a fixed cost, about what
    #: converting 10 000 rows costs (benchmarks.spark_source, local[2]: 200 k
    #: jobs in batches of 100 k spent 1.9 s in addBatch as 20 tasks, 1.3 s as
    #: 8, median runs of the same rounds); a default batch still has 4 tasks.
    jobs_per_partition: int = DEFAULT_JOBS_PER_PARTITION
    working_interval_ms: int | None = None
    log_level: str = "warning"
    min_job_retry_ms: int = 1000
    #: Driver fetch mode: stage the next batch and acknowledge the committed
    #: one in a background thread while Spark runs the current batch, when
    #: the batch was full and its lease leaves room (.ahead.FetchAhead.pays).
    fetch_ahead: bool = True
    # Batch reads (spark.read) only:
    drain: bool = False
    max_jobs: int | None = None
    #: Dead-letter queues read after ``queues`` (already included in
    #: ``queues``); non-empty also reports ``deadLettered`` (QSTAT).
    dead_letter_queues: tuple[str, ...] = ()
    #: ``staging.<argument>`` options: the staging filesystem's arguments.
    staging_options: tuple[tuple[str, str], ...] = ()
    #: ``onLostStaging``: a batch in Spark's offset log but not staged:
    #: ``fail`` the query, or ``refetch`` a new batch in its place.
    on_lost_staging: Literal["fail", "refetch"] = "fail"
    #: ``includeHeaders``: the ``headers`` column (GETJOB ... WITHHEADERS).
    include_headers: bool = False
    #: ``includeGroups``: the ``group`` and ``group_position`` columns
    #: (GETJOB ... WITHGROUP).
    include_groups: bool = False
    #: ``telemetrySetup``: ``module:function`` called once per Python
    #: process before its first span (:mod:`.telemetry`).
    telemetry_setup: str | None = None

    @property
    def live_queues(self) -> tuple[str, ...]:
        """The queues named by ``queues`` (without the dead-letter ones)."""
        return tuple(q for q in self.queues if q not in self.dead_letter_queues)

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, streaming: bool) -> SourceConfig:
        raw_queues = option_str(options, "queues", required=True)
        assert raw_queues is not None
        queues = tuple(dict.fromkeys(_split_list(raw_queues)))
        if not queues:
            raise OptionError("queues", f"must name at least one queue, got {raw_queues!r}")
        staging = option_str(options, "stagingPath", required=streaming)
        if staging is not None:
            from .stores import absolute_uri

            staging = absolute_uri(staging)
        max_jobs = option_int(options, "maxJobsPerTrigger", None, minimum=1,
                              maximum=MAX_JOBS_PER_BATCH)
        min_jobs = option_int(options, "minJobsPerTrigger", None, minimum=1,
                              maximum=MAX_JOBS_PER_BATCH)
        if max_jobs is not None and min_jobs is not None and min_jobs > max_jobs:
            raise OptionError("minJobsPerTrigger",
                              f"({min_jobs}) must not exceed maxJobsPerTrigger ({max_jobs})")
        working = option_duration_ms(options, "workingIntervalMs", None, minimum=100)
        dead = _dead_letter_queues(option_str(options, "deadLetterQueues"), queues)
        return cls(
            connection=ConnectionConfig.from_options(options),
            queues=queues + tuple(q for q in dead if q not in queues),
            dead_letter_queues=tuple(q for q in dead if q not in queues),
            staging_path=staging,
            body_format=option_choice(options, "bodyFormat", ("binary", "string"),
                                      "binary"),  # type: ignore[arg-type]
            ack_mode=option_choice(options, "ackMode", ("ackjob", "fastack"),
                                   "ackjob"),  # type: ignore[arg-type]
            fetch_mode=option_choice(options, "fetchMode", ("driver", "executor"),
                                     "driver"),  # type: ignore[arg-type]
            max_jobs_per_trigger=max_jobs,
            min_jobs_per_trigger=min_jobs,
            max_trigger_delay_ms=option_duration_ms(options, "maxTriggerDelay",
                                                    15 * 60_000) or 0,
            fetch_batch_size=option_int(options, "fetchBatchSize", 1000,
                                        minimum=1, maximum=100_000) or 1000,
            fetch_timeout_ms=option_duration_ms(options, "fetchTimeoutMs", 500) or 0,
            num_partitions=option_int(options, "numPartitions", 1,
                                      minimum=1, maximum=10_000) or 1,
            jobs_per_partition=option_int(options, "jobsPerPartition",
                                          DEFAULT_JOBS_PER_PARTITION, minimum=1,
                                          maximum=MAX_JOBS_PER_BATCH)
            or DEFAULT_JOBS_PER_PARTITION,
            working_interval_ms=working,
            min_job_retry_ms=option_duration_ms(options, "minJobRetry", 1000,
                                                minimum=1000) or 1000,
            fetch_ahead=option_bool(options, "fetchAhead", True),
            log_level=option_choice(options, "logLevel", ("debug", "info", "warning", "error"),
                                    "warning"),
            drain=option_bool(options, "drain", False),
            max_jobs=option_int(options, "maxJobs", None, minimum=1, maximum=2**62),
            staging_options=_prefixed(options, STAGING_OPTION_PREFIX),
            on_lost_staging=option_choice(options, "onLostStaging", ("fail", "refetch"),
                                          "fail"),  # type: ignore[arg-type]
            include_headers=option_bool(options, "includeHeaders", False),
            include_groups=option_bool(options, "includeGroups", False),
            telemetry_setup=option_telemetry_setup(options),
        )
