"""The ``disque`` program: its options, then one command or the prompt."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from .prompt import interactive
from .session import EXIT_OK, Cli

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disque", add_help=False,
        description="Command-line client for Disque (like redis-cli).",
        epilog="Without a command, starts an interactive prompt.")
    parser.add_argument("-h", dest="host", default="127.0.0.1", help="server host (127.0.0.1)")
    parser.add_argument("-p", dest="port", type=int, default=7711, help="server port (7711)")
    parser.add_argument("-a", dest="password", default=None,
                        help="password (also $DISQUE_PASSWORD)")
    parser.add_argument("--user", dest="user", default=None,
                        help="user to authenticate as, with -a (ACL; default: the default user)")
    tls = parser.add_argument_group("TLS (a node's tls-port; like redis-cli)")
    tls.add_argument("--tls", action="store_true", help="connect with TLS")
    tls.add_argument("--cacert", default=None,
                     help="CA certificate file to verify the node (implies --tls)")
    tls.add_argument("--cert", default=None,
                     help="client certificate file, for tls-auth-clients (implies --tls)")
    tls.add_argument("--key", default=None, help="private key file of --cert")
    tls.add_argument("--insecure", action="store_true",
                     help="do not verify the node's certificate (like redis-cli)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--raw", dest="raw", action="store_true", default=None,
                      help="raw output, even on a terminal")
    mode.add_argument("--no-raw", dest="raw", action="store_false",
                      help="formatted output, even when not a terminal")
    parser.add_argument("--help", action="help", help="show this help and exit")
    parser.add_argument("--version", action="version", version=f"disque {__version__}")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="command and arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``disque`` script; returns the exit status."""
    parser = _parser()
    options = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if (options.cert is None) != (options.key is None):
        parser.error("--cert and --key go together (a client certificate and its key)")
    if options.user is not None and not (options.password or os.environ.get("DISQUE_PASSWORD")):
        parser.error("--user needs a password (-a or $DISQUE_PASSWORD)")
    out = sys.stdout.buffer
    cli = Cli(options, out, sys.stderr)
    args = [os.fsencode(a) for a in options.command]
    try:
        if args:
            return cli.one_shot(args)
        return interactive(cli)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # piped into head & co: stop quietly, like redis-cli
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK

