"""Connection and server commands: PING ECHO QUIT AUTH HELLO INFO CONFIG
DEBUG COMMAND CLIENT TIME SHUTDOWN."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..config import DIRECTIVES, ConfigError
from ..info import info_text
from ..protocol import OK, Map, ReplyError, Status
from ..reset import flush_all
from .registry import COMMANDS, SYNTAX_ERROR, CommandError, command, lookup, parse_int

if TYPE_CHECKING:
    from ..connection import ClientConnection
    from ..state import ServerState

PONG = Status("PONG")


@command("ping", -1, "fast noauth", categories="connection")
def ping(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        raise CommandError("ERR wrong number of arguments for 'ping' command")
    if client.user is None and len(argv) == 2:
        # Health checks may PING before AUTH; only the bare form is allowed.
        raise CommandError("NOAUTH Authentication required.")
    return argv[1] if len(argv) == 2 else PONG


@command("echo", 2, "fast", categories="connection")
def echo(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    return argv[1]


@command("quit", -1, "fast noauth", categories="connection")
def quit_(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    client.close_after_reply()
    return OK


WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."


def _check_password(state: ServerState, client: ClientConnection, user: bytes | None,
                    password: bytes) -> None:
    """AUTH [user] password: authenticate as ``user`` (``default`` without one).

    ``default`` keeps the original's replies (``requirepass`` is its
    password); a named user answers as Redis's ACL does.  Passwords are
    compared as SHA-256 digests with ``hmac.compare_digest``: the time does
    not depend on how much of a guess is right, nor on its length.  A
    failed AUTH leaves the connection unauthenticated (the original's rule),
    or ``default`` when that needs no password.
    """
    acl = state.acl
    name = (user or b"default").decode("utf-8", "surrogateescape")
    target = acl.users.get(name)
    if target is acl.default and target.nopass:
        raise CommandError("ERR Client sent AUTH, but no password is set")
    if target is None or not target.enabled or not target.password_ok(password):
        client.user = acl.initial_user()
        acl.denied(name if target is not None else "", "auth")
        raise CommandError("ERR invalid password" if name == "default" else WRONGPASS)
    client.user = target


@command("auth", -2, "fast noauth", categories="connection")
def auth(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """AUTH password | AUTH user password."""
    if len(argv) > 3:
        raise CommandError(SYNTAX_ERROR)
    user = argv[1] if len(argv) == 3 else None
    _check_password(state, client, user, argv[-1])
    return OK


@command("hello", -1, "fast noauth", categories="connection")
def hello(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """Bare HELLO: the Disque handshake.  HELLO 2|3 [AUTH u p] [SETNAME n]: RESP negotiation."""
    if len(argv) == 1:
        if client.user is None:
            raise CommandError("NOAUTH Authentication required.")
        return disque_hello(state, client)
    version = parse_int(argv[1], "ERR Protocol version is not an integer or out of range")
    if version not in (2, 3):
        raise CommandError("NOPROTO unsupported protocol version")
    i = 2
    name: bytes | None = None
    while i < len(argv):
        opt = argv[i].lower()
        if opt == b"auth" and i + 2 < len(argv):
            _check_password(state, client, argv[i + 1], argv[i + 2])
            i += 3
        elif opt == b"setname" and i + 1 < len(argv):
            name = _valid_client_name(argv[i + 1])
            i += 2
        else:
            option = argv[i].decode("utf-8", "replace")
            raise CommandError(f"ERR Syntax error in HELLO option '{option}'")
    if client.user is None:
        raise CommandError("NOAUTH HELLO must be called with the client already authenticated, "
                           "otherwise the HELLO <proto> AUTH <user> <pass> option can be used to "
                           "authenticate the client and select the RESP protocol version at the "
                           "same time")
    if name is not None:
        client.name = name
    client.resp3 = version == 3
    return Map([
        b"server", b"disque",
        b"version", __version__.encode(),
        b"proto", version,
        b"id", client.id,
        b"mode", b"cluster",
        b"role", b"master",
        b"modules", [],
        b"node-id", state.cluster.myself_id.encode(),
    ])


def disque_hello(state: ServerState, client: ClientConnection) -> list[Any]:
    """``[1, my-id, [id, ip, port, priority]...]``, myself first.

    A node that does not know its own address yet (no CLUSTER MEET, bound to
    a wildcard) reports the address this client reached it on, so clients
    that reconnect using HELLO get a usable one.
    """
    cluster = state.cluster
    nodes = [cluster.myself] + [n for n in cluster.nodes.values() if n is not cluster.myself]
    entries = []
    for node in nodes:
        ip = node.ip
        if node is cluster.myself and (not ip or ip in ("0.0.0.0", "::")):
            ip = client.local_ip
        entries.append([node.id.encode(), ip.encode(), str(node.port).encode(),
                        str(node.priority).encode()])
    return [1, cluster.myself_id.encode(), *entries]


@command("info", -1, "", categories="dangerous")
def info(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        raise CommandError(SYNTAX_ERROR)
    section = argv[1].decode("utf-8", "replace") if len(argv) == 2 else None
    return info_text(state, section)


@command("time", 1, "fast", categories="connection")
def time_(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    now_us = time.time_ns() // 1000
    return [str(now_us // 1_000_000).encode(), str(now_us % 1_000_000).encode()]


# --------------------------------------------------------------------------
# CONFIG
# --------------------------------------------------------------------------

@command("config", -2, "admin")
def config(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    try:
        if sub == b"get" and len(argv) == 3:
            out: list[bytes] = []
            for name, value in state.config.matching(argv[2].decode("utf-8", "replace")):
                out += [name.encode(), value.encode("utf-8", "surrogateescape")]
            return out
        if sub == b"set" and len(argv) == 4:
            name = argv[2].decode("utf-8", "replace")
            _check_protected(state, client, name)
            state.config.set(name, argv[3].decode("utf-8", "surrogateescape"))
            return OK
        if sub == b"rewrite" and len(argv) == 2:
            state.config.rewrite()
            return OK
        if sub == b"resetstat" and len(argv) == 2:
            from ..state import Stats
            state.stats = Stats()
            return OK
    except ConfigError as err:
        raise CommandError(f"ERR {err}") from None
    except OSError as err:
        raise CommandError(f"ERR Rewriting config file: {err}") from None
    if sub in (b"get", b"set", b"rewrite", b"resetstat"):
        raise CommandError(f"ERR Wrong number of arguments for CONFIG {sub.decode().upper()}")
    raise CommandError("ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")


def _check_protected(state: ServerState, client: ClientConnection, name: str) -> None:
    """Refuse CONFIG SET of a setting that points the node at the file
    system unless ``enable-protected-configs`` allows it (Redis 7's rule and
    text): with ``dir`` an admin login could make the node write its files
    anywhere it can (``/etc/cron.d``, ``~/.ssh``)."""
    directive = DIRECTIVES.get(name.lower())
    if directive is None or not directive.protected:
        return
    allowed: str = state.config.enable_protected_configs
    if allowed == "yes" or (allowed == "local" and _is_local(client.addr)):
        return
    raise CommandError(f"ERR CONFIG SET failed (possibly related to argument '{name}') - "
                       "can't set protected config (enable-protected-configs is "
                       f"{allowed})")


def _is_local(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("/")


# --------------------------------------------------------------------------
# DEBUG
# --------------------------------------------------------------------------

@command("debug", -2, "admin")
def debug(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    if sub == b"flushall" and len(argv) == 2:
        flush_all(state)
        return OK
    if sub == b"sleep" and len(argv) == 3:
        try:
            seconds = float(argv[2])
        except ValueError:
            raise CommandError("ERR value is not a valid float") from None
        if not 0 <= seconds <= 60:
            raise CommandError("ERR DEBUG SLEEP takes 0 to 60 seconds")
        time.sleep(seconds)
        return OK
    raise CommandError("ERR DEBUG subcommand must be one of FLUSHALL, SLEEP <seconds>")


# --------------------------------------------------------------------------
# COMMAND
# --------------------------------------------------------------------------

def _command_entry(cmd) -> list[Any]:
    return [cmd.name.encode(), cmd.arity, [Status(f) for f in sorted(cmd.flags)], 0, 0, 0]


@command("command", -1, "", categories="connection")
def command_(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """COMMAND, COMMAND COUNT, COMMAND INFO name..., COMMAND DOCS (empty)."""
    unique = {id(c): c for c in COMMANDS.values()}.values()
    if len(argv) == 1:
        return [_command_entry(c) for c in sorted(unique, key=lambda c: c.name)]
    sub = argv[1].lower()
    if sub == b"count" and len(argv) == 2:
        return len(unique)
    if sub == b"info":
        out = []
        for name in argv[2:]:
            cmd = lookup(name)
            out.append(_command_entry(cmd) if cmd else None)
        return out
    if sub == b"docs":
        return Map([])
    raise CommandError("ERR unknown subcommand or wrong number of arguments for 'command'")


# --------------------------------------------------------------------------
# CLIENT
# --------------------------------------------------------------------------

def _valid_client_name(name: bytes) -> bytes:
    if any(ch <= 32 or ch >= 127 for ch in name):
        raise CommandError("ERR Client names cannot contain spaces, newlines or special "
                           "characters.")
    return name


@command("client", -2, "admin noauth", categories="connection",
         free_subcommands="setinfo setname getname id info")
def client_(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    if client.user is None and sub != b"setinfo":
        raise CommandError("NOAUTH Authentication required.")
    n = len(argv)
    if sub == b"list" and n == 2:
        return "".join(c.describe() + "\n" for c in state.clients.values())
    if sub == b"info" and n == 2:
        return client.describe() + "\n"
    if sub == b"id" and n == 2:
        return client.id
    if sub == b"getname" and n == 2:
        return client.name or None
    if sub == b"setname" and n == 3:
        client.name = _valid_client_name(argv[2])
        return OK
    if sub == b"setinfo" and n == 4:
        attr = argv[2].lower()
        if attr not in (b"lib-name", b"lib-ver"):
            raise CommandError(f"ERR Unrecognized option '{argv[2].decode('utf-8', 'replace')}'")
        value = _valid_client_name(argv[3]) if argv[3] else b""
        if attr == b"lib-name":
            client.lib_name = value
        else:
            client.lib_ver = value
        return OK
    if sub == b"kill" and n >= 3:
        return _client_kill(state, client, argv[2:])
    raise CommandError("ERR Syntax error, try CLIENT (LIST | KILL | GETNAME | SETNAME | ID | "
                       "INFO | SETINFO)")


def _client_kill(state: ServerState, me: ClientConnection, args: list[bytes]) -> Any:
    if len(args) == 1:  # old form: CLIENT KILL addr:port
        addr = args[0].decode("utf-8", "replace")
        for other in list(state.clients.values()):
            if other.addr == addr:
                other.kill()
                return OK
        return ReplyError("ERR No such client")
    if len(args) % 2:
        raise CommandError(SYNTAX_ERROR)
    filters: dict[bytes, bytes] = {}
    for key, value in zip(args[::2], args[1::2], strict=True):
        key = key.lower()
        if key not in (b"id", b"addr", b"laddr", b"skipme", b"user"):
            raise CommandError(SYNTAX_ERROR)
        filters[key] = value
    skipme = filters.get(b"skipme", b"yes").lower()
    if skipme not in (b"yes", b"no"):
        raise CommandError(SYNTAX_ERROR)
    wanted_id = parse_int(filters[b"id"], "ERR client-id should be greater than 0", 1) \
        if b"id" in filters else None
    killed = 0
    for other in list(state.clients.values()):
        if other is me and skipme == b"yes":
            continue
        if wanted_id is not None and other.id != wanted_id:
            continue
        if b"addr" in filters and other.addr.encode() != filters[b"addr"]:
            continue
        if b"laddr" in filters and other.laddr.encode() != filters[b"laddr"]:
            continue
        if b"user" in filters and (other.user is None
                                   or other.user.name.encode() != filters[b"user"]):
            continue
        other.kill()
        killed += 1
    return killed


# --------------------------------------------------------------------------
# SHUTDOWN
# --------------------------------------------------------------------------

_SHUTDOWN_MODES = {b"nosave": "nosave", b"save": "save", b"rewrite-aof": "rewrite-aof"}


@command("shutdown", -1, "admin")
def shutdown(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """SHUTDOWN [NOSAVE|SAVE|REWRITE-AOF]: stop the node (no reply on success)."""
    if len(argv) > 2:
        raise CommandError(SYNTAX_ERROR)
    mode = ""
    if len(argv) == 2:
        mode = _SHUTDOWN_MODES.get(argv[1].lower(), "")
        if not mode:
            raise CommandError(SYNTAX_ERROR)
    if state.shutdown_requested is None:
        raise CommandError("ERR Errors trying to SHUTDOWN. Check logs.")
    error = state.shutdown_requested(mode)
    if error:
        raise CommandError(f"ERR Errors trying to SHUTDOWN: {error}")
    client.close_after_reply(silent=True)
    return OK
