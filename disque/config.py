"""Configuration: the original's ``disque.conf`` directives, typed.

One table (:data:`DIRECTIVES`) names every directive with its parser,
formatter, default and whether ``CONFIG SET`` may change it at run time.
Sources, later ones winning: the defaults, the config file, then
``--directive value`` arguments on the command line (like the original).

``CONFIG REWRITE`` rewrites the file it was loaded from in place: lines of
known directives get their current value, comments and everything else are
kept, and changed directives that were not in the file are appended.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
import shlex
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .cluster.auth import MIN_SECRET_LENGTH

__all__ = ["Config", "ConfigError", "DIRECTIVES", "OutputBufferLimit", "parse_memory",
           "format_memory"]


class ConfigError(ValueError):
    """A bad directive or value; the message is shown to the user as is."""


# --------------------------------------------------------------------------
# Value types
# --------------------------------------------------------------------------

_MEMORY = re.compile(r"^(\d+)(k|kb|m|mb|g|gb|b)?$", re.IGNORECASE)
_UNITS = {None: 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000 ** 2, "mb": 1024 ** 2,
          "g": 1000 ** 3, "gb": 1024 ** 3}


#: Memory values are byte counts in 64 bits, as in the original.
MAX_MEMORY_VALUE = 2 ** 63 - 1


def parse_memory(text: str) -> int:
    """``1gb`` -> 1073741824, ``100k`` -> 100000 (Redis's memtoll units)."""
    match = _MEMORY.match(text.strip())
    if not match:
        raise ValueError(f"invalid memory value {text!r}: use a byte count, "
                         "optionally with k, kb, m, mb, g or gb")
    unit = match.group(2).lower() if match.group(2) else None
    digits = match.group(1)
    value = int(digits) * _UNITS[unit] if len(digits) <= 19 else MAX_MEMORY_VALUE + 1
    if value > MAX_MEMORY_VALUE:
        raise ValueError(f"memory value {text!r} is out of range: at most "
                         f"{MAX_MEMORY_VALUE} bytes")
    return value


def format_memory(value: int) -> str:
    for unit, size in (("gb", 1024 ** 3), ("mb", 1024 ** 2), ("kb", 1024)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _yes_no(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("yes", "no"):
        raise ValueError("argument must be 'yes' or 'no'")
    return lowered == "yes"


def _int_range(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"argument must be an integer between {low} and {high}") from None
        if not low <= value <= high:
            raise ValueError(f"argument must be between {low} and {high}")
        return value
    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.lower()
        if lowered not in choices:
            raise ValueError(f"argument must be one of {', '.join(choices)}")
        return lowered
    return parse


def _string(text: str) -> str:
    return text


def _bind(text: str) -> list[str]:
    addresses = text.split()
    if not addresses:
        raise ValueError("at least one address is required")
    return addresses


def _secret(text: str) -> str:
    # "" is off; anything else is an HMAC key (cluster/auth.py), which a
    # short value would make guessable offline from one captured message.
    if text and len(text.encode("utf-8", "surrogateescape")) < MIN_SECRET_LENGTH:
        raise ValueError(f"the cluster secret must be at least {MIN_SECRET_LENGTH} "
                         "characters long")
    return text


def _announce_ip(text: str) -> str:
    # ValueError: not an IP address.  Compressed: at most 39 characters,
    # what the bus header has room for (cluster/messages.py).
    return str(ipaddress.ip_address(text)) if text else text


def _discovery(text: str) -> str:
    """NAME[:PORT] (NAME a DNS name or an IP): checked here, split by
    ``cluster/discovery.py``."""
    if not text:
        return text
    name, sep, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if not sep:
        name = text
    elif not port.isdigit() or not 0 < int(port) <= 55535:
        raise ValueError(f"bad port in '{text}'")
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"bad name in '{text}'")
    return text


def _memory_at_least(least: int) -> Callable[[str], int]:
    """A memory value of at least ``least`` bytes.

    For the request limits: below a few bytes every command is a protocol
    error, the CONFIG SET that would undo it included, and the node can only
    be killed.  Redis has the same 1mb floor for both.
    """
    def parse(text: str) -> int:
        value = parse_memory(text)
        if value < least:
            raise ValueError(f"must be at least {format_memory(least)}: a smaller limit "
                             "refuses every command, CONFIG SET included")
        return value
    return parse


@dataclass(frozen=True)
class OutputBufferLimit:
    """``client-output-buffer-limit normal <hard> <soft> <soft-seconds>``.

    A client whose unsent replies reach ``hard`` bytes, or stay above
    ``soft`` bytes for ``soft_seconds``, is disconnected (0: no limit).
    Redis's directive; the node has one class of clients, ``normal``.
    """

    hard: int
    soft: int
    soft_seconds: int


def _output_buffer_limit(text: str) -> OutputBufferLimit:
    words = text.split()
    if len(words) != 4:
        raise ValueError("expected: normal <hard limit> <soft limit> <soft seconds>")
    if words[0].lower() != "normal":
        raise ValueError(f"Invalid client class specified in buffer limit: {words[0]} "
                         "(this node has one class, normal)")
    hard, soft = parse_memory(words[1]), parse_memory(words[2])
    seconds = _int_range(0, 2 ** 31 - 1)(words[3])
    if hard and hard < 1024 ** 2:
        raise ValueError("the hard limit must be 0 (none) or at least 1mb: a smaller one "
                         "disconnects a client for an ordinary reply")
    if soft and hard and soft > hard:
        raise ValueError("the soft limit must not be above the hard limit")
    return OutputBufferLimit(hard, soft, seconds)


def _fmt_output_buffer_limit(value: OutputBufferLimit) -> str:
    return (f"normal {format_memory(value.hard)} {format_memory(value.soft)} "
            f"{value.soft_seconds}")


def _memory_between(least: int, most: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_memory(text)
        if not least <= value <= most:
            raise ValueError(f"must be between {format_memory(least)} and {format_memory(most)}")
        return value
    return parse


def _fmt_bool(value: bool) -> str:
    return "yes" if value else "no"


def _fmt_str(value: Any) -> str:
    return str(value)


def _fmt_bind(value: list[str]) -> str:
    return " ".join(value)


@dataclass(frozen=True)
class Directive:
    name: str
    parse: Callable[[str], Any]
    default: Any
    fmt: Callable[[Any], str] = _fmt_str
    mutable: bool = True
    doc: str = ""
    #: Points the node at the file system: CONFIG SET refuses it unless
    #: ``enable-protected-configs`` allows it (Redis 7's protected configs).
    protected: bool = False

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")


DIRECTIVES: dict[str, Directive] = {d.name: d for d in [
    Directive("port", _int_range(0, 55535), 7711, mutable=False,
              doc="client port; the cluster bus listens on port + 10000"),
    Directive("bind", _bind, ["127.0.0.1"], _fmt_bind, mutable=False,
              doc="addresses to listen on"),
    Directive("dir", _string, ".", protected=True,
              doc="working directory for nodes.conf, the AOF and logs"),
    Directive("logfile", _string, "", mutable=False, doc='log file; "" logs to stdout'),
    Directive("loglevel", _choice("debug", "verbose", "notice", "warning"), "notice",
              doc="debug, verbose, notice or warning"),
    Directive("daemonize", _yes_no, False, _fmt_bool, mutable=False,
              doc="run in the background; the command returns once the node listens"),
    Directive("pidfile", _string, "", mutable=False, doc='file to write the pid to; "" = none'),
    Directive("requirepass", _string, "", doc="password clients must AUTH with"),
    Directive("hz", _int_range(1, 500), 10, doc="frequency of periodic tasks"),
    Directive("timeout", _int_range(0, 2 ** 31 - 1), 0, doc="close idle clients after N s"),
    Directive("tcp-keepalive", _int_range(0, 2 ** 31 - 1), 300,
              doc="TCP keepalive interval of client connections, in s; 0 = off"),
    Directive("tcp-backlog", _int_range(1, 65535), 511, mutable=False,
              doc="listen() backlog of the client port"),
    Directive("maxclients", _int_range(1, 1_000_000), 10000,
              doc="most client connections at once"),
    Directive("maxmemory", parse_memory, 1024 ** 3, format_memory,
              doc="limit of the node's data (INFO used_memory); 0: always at the 95% level"),
    Directive("maxmemory-policy", _choice("acks", "noeviction"), "acks",
              doc="acks: evict acked and delivered at-most-once jobs at 95%"),
    Directive("proto-max-bulk-len", _memory_at_least(1024 ** 2), 512 * 1024 ** 2,
              format_memory, doc="largest argument (job body) a client may send"),
    Directive("client-query-buffer-limit", _memory_at_least(1024 ** 2), 1024 ** 3,
              format_memory, doc="most unprocessed input one client may have"),
    # Limits against clients that mean harm (docs/SECURITY.md).
    Directive("client-output-buffer-limit", _output_buffer_limit,
              OutputBufferLimit(1024 ** 3, 256 * 1024 ** 2, 60), _fmt_output_buffer_limit,
              doc="normal <hard> <soft> <seconds>: disconnect a client whose unsent replies "
                  "reach <hard> bytes, or stay above <soft> for <seconds>; 0 = no limit"),
    Directive("auth-timeout", _int_range(0, 2 ** 31 - 1), 10,
              doc="seconds a connection may stay without authenticating, when a password "
                  "is needed; 0 = no limit"),
    Directive("max-queue-name-len", _memory_between(1, 512 * 1024 ** 2), 1024, format_memory,
              doc="longest queue name a command may give, in bytes"),
    Directive("max-queues-per-command", _int_range(1, 2 ** 31 - 1), 1024,
              doc="most queues one command may name (GETJOB ... FROM)"),
    Directive("enable-protected-configs", _choice("no", "yes", "local"), "no", mutable=False,
              doc="whether CONFIG SET may change dir: no, yes, or local (loopback "
                  "clients only)"),
    Directive("appendonly", _yes_no, False, _fmt_bool,
              doc="log jobs to the append-only file and load it at start-up"),
    Directive("appendfilename", _string, "appendonly.aof", mutable=False,
              doc="the append-only file, in dir"),
    Directive("appendfsync", _choice("always", "everysec", "no"), "everysec",
              doc="fsync the AOF before every reply, once a second, or never"),
    Directive("aof-enqueue-jobs-once", _yes_no, False, _fmt_bool,
              doc="next start: load the AOF and restore the queues, then switch off"),
    Directive("aof-load-truncated", _yes_no, True, _fmt_bool,
              doc="start with a torn last AOF record dropped (no: refuse to start)"),
    Directive("auto-aof-rewrite-percentage", _int_range(0, 2 ** 31 - 1), 100,
              doc="rewrite the AOF when it grew this much since the last rewrite; 0 = never"),
    Directive("auto-aof-rewrite-min-size", parse_memory, 64 * 1024 ** 2, format_memory,
              doc="no automatic rewrite below this size"),
    Directive("shutdown-timeout", _int_range(0, 3600), 10,
              doc="seconds SIGTERM's drain may take (hand queued jobs to other nodes, "
                  "then stop); 0 = stop at once"),
    Directive("idmp-max-keys", _int_range(1, 2 ** 31 - 1), 1_000_000,
              doc="most IDMP keys (idempotent ADDJOB) a node holds; the oldest go first"),
    # Job headers (ADDJOB ... HEADER, an extension; disque/headers.py has the
    # defaults' reasons, docs/EXTENSIONS.md compares them with other brokers).
    Directive("max-job-headers", _int_range(0, 65535), 64,
              doc="most headers one job may carry (ADDJOB ... HEADER); 0 = no headers"),
    Directive("max-job-headers-size", _memory_between(0, 512 * 1024 ** 2), 64 * 1024,
              format_memory,
              doc="most bytes of header names and values one job may carry"),
    # Ordered groups (ADDJOB ... GROUP, an extension; disque/groups.py).
    Directive("max-group-key-len", _int_range(1, 65535), 256,
              doc="longest GROUP key a job may carry (ADDJOB ... GROUP), in bytes"),
    Directive("cluster-config-file", _string, "nodes.conf", mutable=False,
              doc="the node's ID and known peers, in dir (written by the node)"),
    Directive("cluster-node-timeout", _int_range(1, 2 ** 31 - 1), 15000,
              doc="ms without an answer before a peer is flagged as possibly failing"),
    # Redis's names: the address peers and clients are told to reach this
    # node at, for a node behind address translation (docs/CLUSTER.md).
    Directive("cluster-announce-ip", _announce_ip, "", mutable=False,
              doc='IP this node announces to peers (bus) and clients (HELLO, CLUSTER '
                  'NODES); "" = its own address'),
    Directive("cluster-announce-port", _int_range(0, 65535), 0, mutable=False,
              doc="client port this node announces; 0 = port"),
    Directive("cluster-announce-bus-port", _int_range(0, 65535), 0, mutable=False,
              doc="cluster bus port this node announces; 0 = port + 10000"),
    # Peers found by DNS (docs/CLUSTER.md, "Discovery by DNS").
    Directive("cluster-discovery", _discovery, "", mutable=False,
              doc='NAME[:PORT]: every address the DNS name resolves to is a peer at PORT '
                  '(default: port), met if unknown; "" = off'),
    Directive("cluster-discovery-interval", _int_range(1, 3600), 5,
              doc="seconds between two resolutions of cluster-discovery"),
    Directive("cluster-discovery-forget-time", _int_range(0, 2 ** 31 - 1), 60,
              doc="seconds a failing node must stay out of the discovery answer, while "
                  "every address in it is a known node, before it is forgotten; 0 = never"),
    # Extensions (docs/EXTENSIONS.md): all off by default.
    Directive("cluster-secret", _secret, "", mutable=False,
              doc="HMAC key signing every cluster bus message; every node needs the same"),
    Directive("metrics-port", _int_range(0, 65535), 0, mutable=False,
              doc="Prometheus endpoint (HTTP GET /metrics); 0 = off"),
    Directive("metrics-bind", _bind, ["127.0.0.1"], _fmt_bind, mutable=False,
              doc="addresses the metrics endpoint listens on"),
    Directive("tls-port", _int_range(0, 65535), 0, mutable=False,
              doc="TLS client port, beside the plain one; 0 = off"),
    Directive("tls-cert-file", _string, "", mutable=False, doc="the node's certificate (PEM)"),
    Directive("tls-key-file", _string, "", mutable=False, doc="its private key (PEM)"),
    Directive("tls-ca-cert-file", _string, "", mutable=False,
              doc="CA certificates that client certificates must chain to (PEM)"),
    Directive("tls-auth-clients", _choice("yes", "no", "optional"), "yes", mutable=False,
              doc="require (yes), ignore (no) or check if sent (optional) client certificates"),
    Directive("aclfile", _string, "", mutable=False,
              doc='users and their permissions, loaded at start, written by ACL SAVE; "" = none'),
    # The cluster bus's own protections (docs/SECURITY.md).
    Directive("tls-cluster", _yes_no, False, _fmt_bool, mutable=False,
              doc="TLS on the cluster bus with tls-cert-file and tls-key-file, peers "
                  "verified against tls-ca-cert-file; every node needs it (original "
                  "nodes cannot join)"),
    # A cluster of N nodes needs N - 1 inbound links, and for a moment twice
    # that when peers reconnect (a new link arrives before the old one is
    # seen dead): 1024 serves a cluster of 500 nodes, far beyond Disque's
    # usual sizes, while strangers can hold at most 1024 sockets of 64 KB
    # each (messages.UNPROVEN_MESSAGE), each for 5 s (cluster/bus.py).
    Directive("cluster-max-inbound-links", _int_range(1, 1_000_000), 1024,
              doc="most cluster bus links other nodes may open to this one; at the limit "
                  "an unproven link gives way to a new one, or the new one is refused"),
]}


class Config:
    """Current values, as attributes named after the directives (``maxmemory_policy``)."""

    if TYPE_CHECKING:
        # The attributes are made from DIRECTIVES at run time.
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    def __init__(self) -> None:
        for directive in DIRECTIVES.values():
            default = directive.default
            setattr(self, directive.attr, list(default) if isinstance(default, list) else default)
        self.config_file: str | None = None
        self._listeners: dict[str, list[Callable[[Any], None]]] = {}

    # -- loading ------------------------------------------------------------

    @classmethod
    def from_args(cls, argv: list[str]) -> Config:
        """``[config-file] [--directive value ...]``, as disque-server takes them."""
        config = cls()
        args = list(argv)
        if args and not args[0].startswith("--"):
            config.config_file = os.path.abspath(args.pop(0))
            try:
                with open(config.config_file, encoding="utf-8", errors="surrogateescape") as fh:
                    config.load_text(fh.read(), config.config_file)
            except OSError as err:
                raise ConfigError(f"Fatal error, can't open config file "
                                  f"'{config.config_file}': {err.strerror}") from None
        lines: list[str] = []
        for arg in args:
            if arg.startswith("--"):
                lines.append(arg[2:])
            elif lines:
                lines[-1] += " " + shlex.quote(arg)
            else:
                raise ConfigError(f"Invalid argument {arg!r}: directives start with --")
        config.load_text("\n".join(lines), "command line")
        return config

    def load_text(self, text: str, source: str) -> None:
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                words = shlex.split(line)
            except ValueError as err:
                raise ConfigError(f"Bad directive or wrong number of arguments at "
                                  f"{source}:{lineno} '{line}': {err}") from None
            name, values = words[0].lower(), words[1:]
            if name not in DIRECTIVES:
                raise ConfigError(f"Bad directive or wrong number of arguments at "
                                  f"{source}:{lineno} '{line}'")
            if not values:
                raise ConfigError(f"Bad directive or wrong number of arguments at "
                                  f"{source}:{lineno} '{line}'")
            try:
                self._assign(DIRECTIVES[name], " ".join(values))
            except ConfigError as err:
                raise ConfigError(f"{err} at {source}:{lineno} '{line}'") from None

    def _assign(self, directive: Directive, text: str) -> None:
        try:
            value = directive.parse(text)
        except ValueError as err:
            raise ConfigError(f"Invalid argument '{text}' for '{directive.name}': {err}") from None
        setattr(self, directive.attr, value)

    # -- CONFIG GET / SET ---------------------------------------------------

    def get(self, name: str) -> Any:
        return getattr(self, DIRECTIVES[name].attr)

    def formatted(self, name: str) -> str:
        directive = DIRECTIVES[name]
        return directive.fmt(getattr(self, directive.attr))

    def matching(self, pattern: str) -> list[tuple[str, str]]:
        """(name, value) of each directive matching a glob pattern (CONFIG GET)."""
        pattern = pattern.lower()
        return [(name, self.formatted(name)) for name in DIRECTIVES
                if fnmatch.fnmatchcase(name, pattern)]

    def set(self, name: str, text: str) -> None:
        """CONFIG SET: validate, assign, then tell the listeners of ``name``."""
        directive = DIRECTIVES.get(name.lower())
        if directive is None or not directive.mutable:
            raise ConfigError(f"Unsupported CONFIG parameter: {name}")
        old = getattr(self, directive.attr)
        try:
            value = directive.parse(text)
        except ValueError as err:
            # The reason says what would be accepted (a range, a set of words).
            raise ConfigError(f"Invalid argument '{text}' for CONFIG SET '{name}': {err}") from None
        setattr(self, directive.attr, value)
        try:
            for listener in self._listeners.get(directive.name, ()):
                listener(value)
        except Exception as err:
            setattr(self, directive.attr, old)
            raise ConfigError(f"Invalid argument '{text}' for CONFIG SET '{name}': {err}") from None

    def on_change(self, name: str, listener: Callable[[Any], None]) -> None:
        """Call ``listener(new_value)`` after CONFIG SET changes ``name``.

        A listener that raises makes CONFIG SET fail and restores the old value.
        """
        self._listeners.setdefault(name, []).append(listener)

    # -- CONFIG REWRITE -----------------------------------------------------

    def rewrite(self) -> None:
        """Write the current configuration back to the file it came from."""
        if not self.config_file:
            raise ConfigError("The server is running without a config file")
        try:
            with open(self.config_file, encoding="utf-8", errors="surrogateescape") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            lines = []
        seen: set[str] = set()
        out: list[str] = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#") or not stripped:
                out.append(line)
                continue
            name = stripped.split(None, 1)[0].lower()
            if name not in DIRECTIVES:
                out.append(line)
                continue
            if name in seen:
                continue  # one line per directive: the rewritten one
            seen.add(name)
            out.append(self._line(name))
        added = [name for name in DIRECTIVES
                 if name not in seen and self.get(name) != DIRECTIVES[name].default]
        if added:
            out.append("# Generated by CONFIG REWRITE")
            out.extend(self._line(name) for name in added)
        tmp = f"{self.config_file}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write("\n".join(out) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.config_file)

    def render(self) -> str:
        """Every directive with its value and what it does: ``disque-server
        --print-config`` (the defaults, or what a file and arguments make),
        a disque.conf that loads as it is."""
        out = ["# disque.conf: every directive of disque-server, with its value.",
               "# \"directive value\" per line; \"#\" starts a comment; arguments",
               "# (--directive value) override the file. Printed by",
               "# disque-server --print-config [disque.conf] [--directive value ...]"]
        for name, directive in DIRECTIVES.items():
            out.append("")
            doc = directive.doc + ("" if directive.mutable else " (not changed by CONFIG SET)")
            out.extend(textwrap.wrap(doc, 78, initial_indent="# ", subsequent_indent="# "))
            out.append(self._line(name))
        return "\n".join(out) + "\n"

    def _line(self, name: str) -> str:
        value = self.formatted(name)
        if name == "bind":
            return f"{name} {value}"
        if value == "" or any(ch.isspace() for ch in value) or '"' in value:
            value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return f"{name} {value}"
