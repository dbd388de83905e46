"""``disque``: the command-line client, like redis-cli but for Disque.

Usage::

    disque [-h HOST] [-p PORT] [-a PASSWORD] [--raw | --no-raw] [command [arg ...]]
    disque [...] monitor-queues [--interval S] [--count N] [--minlen N]
    disque [...] redrive DEADQUEUE [--to QUEUE] [--rate N] [--journal FILE]

With a command it runs it once, prints the reply and exits (status 1 if the
reply is an error or no connection could be made).  Without one it opens an
interactive prompt (``127.0.0.1:7711>``) with readline editing and history
kept in ``~/.disque_history`` (or ``$DISQUE_HISTFILE``; ``/dev/null`` keeps
none).

Output follows redis-cli, so people and scripts read it the same way:
formatted (``1) "x"``, ``(integer) 5``, ``(nil)``, ``(error) ERR ...``) when
stdout is a terminal, raw (bare values, one per line) when it is not;
``--raw``/``--no-raw`` force either.  INFO, CLUSTER NODES and CLUSTER INFO
are always printed as raw text, as redis-cli does.

``monitor-queues`` is a live QSTAT view: every ``--interval`` seconds it
lists the node's queues (QSCAN) with their QSTAT counters and in/out rates.
``redrive`` moves the jobs of a dead-letter queue back to the queue each died
in, without losing or duplicating one (:mod:`~disque.cli.redrive`).

The rooms: :mod:`~disque.cli.format` prints replies, :mod:`~disque.cli.monitor`
is ``monitor-queues``, :mod:`~disque.cli.redrive` is ``redrive``,
:mod:`~disque.cli.session` runs one command on a
:class:`disque.Client`, :mod:`~disque.cli.prompt` is the interactive
prompt and :mod:`~disque.cli.main` the program's options.
"""

from .format import Status, format_reply
from .main import main
from .prompt import split_args

__all__ = ["main", "format_reply", "split_args", "Status"]
