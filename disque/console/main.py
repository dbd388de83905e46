"""The ``disque-console`` program: options, the safety check on binding, then uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from .prometheus import check_url
from .settings import Settings, is_loopback

__all__ = ["main", "parse_args"]

log = logging.getLogger("disque.console")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disque-console",
        description="A web console for a Disque cluster: queues, jobs, nodes, history.")
    parser.add_argument("--nodes", default="127.0.0.1:7711",
                        help="seed nodes, host:port[,host:port...]; the others are found "
                             "through HELLO (127.0.0.1:7711)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=7780, help="port to serve on (7780; 0: any)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep history, the audit log and the cookie key here "
                             "(default: memory only)")
    parser.add_argument("--allow-open", action="store_true",
                        help="serve outside loopback although the nodes take no password")
    parser.add_argument("--allowed-hosts", default="",
                        help="host names an open console answers besides IP addresses and "
                             "localhost, NAME[,NAME...] (against DNS rebinding)")
    parser.add_argument("--sample-user", default=None,
                        help="user the history sampler reads INFO as (password in "
                             "$DISQUE_CONSOLE_SAMPLE_PASSWORD; default: the default user)")
    parser.add_argument("--sample-interval", type=float, default=1.0,
                        help="seconds between samples of each node (1)")
    parser.add_argument("--history", type=int, default=3600,
                        help="seconds of history kept (3600)")
    parser.add_argument("--session-idle", type=int, default=8 * 3600,
                        help="seconds a session may stay unused (28800)")
    parser.add_argument("--session-lifetime", type=int, default=24 * 3600,
                        help="seconds a session lasts at most, however busy (86400)")
    parser.add_argument("--prometheus-url", default=None, metavar="URL",
                        help="Prometheus scraping the nodes' metrics-port "
                             "(http://host:9090): each chart links to its series there")
    parser.add_argument("--nice", type=int, default=10,
                        help="lower the console's CPU priority by this much at start, so "
                             "that nodes on the same machine come first (10; 0: keep it)")
    parser.add_argument("--browse-budget", type=float, default=50.0, metavar="MS",
                        help="milliseconds a page of a queue's job browser may keep "
                             "scanning to fill itself (50)")
    tls = parser.add_argument_group("TLS to the nodes' tls-port (--nodes then lists every "
                                    "node's TLS address)")
    tls.add_argument("--tls", action="store_true", help="connect to the nodes with TLS")
    tls.add_argument("--cacert", default=None,
                     help="CA certificate file to verify the nodes (implies --tls)")
    tls.add_argument("--cert", default=None,
                     help="client certificate file, for tls-auth-clients (implies --tls)")
    tls.add_argument("--key", default=None, help="private key file of --cert")
    tls.add_argument("--insecure", action="store_true",
                     help="accept any certificate from the nodes (tests only)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"disque-console {__version__}")
    return parser


def parse_args(argv: Sequence[str]) -> tuple[Settings, str]:
    parser = _parser()
    options = parser.parse_args(list(argv))
    nodes = tuple(a.strip() for a in options.nodes.split(",") if a.strip())
    if not nodes:
        parser.error("--nodes lists no node")
    if not 0 <= options.port < 65536:
        parser.error("--port must be between 0 and 65535")
    if options.sample_interval < 0.1 or options.history < 60:
        parser.error("--sample-interval is at least 0.1 s and --history at least 60 s")
    if not 1 <= options.session_idle <= options.session_lifetime:
        parser.error("--session-idle is at least 1 s and at most --session-lifetime")
    if (options.cert is None) != (options.key is None):
        parser.error("--cert and --key go together (a client certificate and its key)")
    prometheus_url = None
    if options.prometheus_url:
        try:
            prometheus_url = check_url(options.prometheus_url)
        except ValueError as exc:
            parser.error(f"--prometheus-url: {exc}")
    if not 0 <= options.nice <= 19:
        parser.error("--nice is between 0 and 19")
    if not 1 <= options.browse_budget <= 10_000:
        parser.error("--browse-budget is between 1 and 10000 ms")
    if options.data_dir is not None:
        private_dir(options.data_dir)
    return Settings(nodes=nodes, bind=options.bind, port=options.port,
                    data_dir=options.data_dir, allow_open=options.allow_open,
                    allowed_hosts=tuple(h.strip() for h in options.allowed_hosts.split(",")
                                        if h.strip()),
                    sample_user=options.sample_user,
                    sample_password=os.environ.get("DISQUE_CONSOLE_SAMPLE_PASSWORD"),
                    sample_interval=options.sample_interval,
                    history_seconds=options.history,
                    session_idle_seconds=options.session_idle,
                    session_lifetime_seconds=options.session_lifetime,
                    browse_budget=options.browse_budget / 1000, nice=options.nice,
                    prometheus_url=prometheus_url,
                    tls=bool(options.tls or options.cacert or options.cert),
                    tls_ca_file=options.cacert, tls_cert_file=options.cert,
                    tls_key_file=options.key, tls_verify=not options.insecure
                    ), options.log_level


def private_dir(path: Path) -> None:
    """The data directory, made and kept for this user alone: it holds the
    cookie key, the audit log, the history and the tasks' journals (queue
    names, job IDs).  Its files, and the ``tasks`` directory, are made
    private too (a directory an older console or a copy left readable)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for entry in [path, *path.iterdir(), *(path / "tasks").glob("*")]:
        try:
            mode = entry.stat().st_mode
            if mode & 0o077:
                os.chmod(entry, 0o700 if entry.is_dir() else 0o600)
        except OSError as exc:  # not ours to change: said, not fatal
            log.warning("cannot make %s private: %s", entry, exc)


def _logging(level: str, data_dir: Path | None) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if data_dir is not None:
        audit = logging.FileHandler(data_dir / "audit.log", encoding="utf-8")
        audit.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger("disque.console.audit").addHandler(audit)


async def _serve(settings: Settings, level: str) -> int:
    import uvicorn

    from .nodes import probe_open
    from .web import create_app

    if not is_loopback(settings.bind) and not settings.allow_open:
        # A console on the network in front of nodes anybody may use is an
        # open door to the cluster: only when told (--allow-open).
        is_open = await probe_open(settings.nodes, settings)
        if is_open is not False:
            why = ("the nodes take no password" if is_open
                   else "no node answered, so it is unknown whether they need a password")
            print(f"disque-console: refusing to serve on {settings.bind}: {why}; anybody "
                  "reaching this address could act on the cluster. Bind to 127.0.0.1, "
                  "set passwords on the nodes, or pass --allow-open.", file=sys.stderr)
            return 2
    family = socket.AF_INET6 if ":" in settings.bind else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on
    # sockets whose proto says TCP, and accepted sockets inherit it.  With
    # Nagle, a response's headers and body (two writes) waited for the
    # browser's delayed ACK: 40 ms on every request of a kept-alive
    # connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((settings.bind.strip("[]"), settings.port))
    except OSError as exc:
        print(f"disque-console: cannot listen on {settings.bind}:{settings.port}: {exc}",
              file=sys.stderr)
        return 1
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings), log_level=level, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    host = f"[{settings.bind}]" if ":" in settings.bind else settings.bind
    log.info("disque-console listening on http://%s:%d (nodes %s)", host, port,
             ",".join(settings.nodes))
    await server.serve(sockets=[sock])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``disque-console``; returns the exit status."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"disque-console needs the 'console' extra ({exc.name} is missing): "
              "pip install 'disque-py[console]'", file=sys.stderr)
        return 1
    # Whatever the console writes (the data directory's files) is its own.
    os.umask(0o077)
    settings, level = parse_args(sys.argv[1:] if argv is None else argv)
    _logging(level, settings.data_dir)
    if settings.nice:
        # The console's work (a queue table's rebuild parses thousands of
        # replies) is never urgent; a node's pickups on the same cores are.
        try:
            os.nice(settings.nice)
        except OSError as exc:  # not allowed here: said, not fatal
            log.warning("cannot lower the console's priority (--nice %d): %s", settings.nice,
                        exc)
    try:
        return asyncio.run(_serve(settings, level))
    except KeyboardInterrupt:
        return 0
