"""The audit log (``disque.console.audit``): one line per action, always one.

Its values come from users and producers: a queue name, a job ID typed in a
form, the user name of a refused login.  A newline among them would let
whoever chose it write a line of their own into the audit log (``user=admin
action=deljob ... result=ok``), and a name that is not UTF-8 (surrogates
from the replies' ``surrogateescape``) made the file handler drop the line
altogether.  So the control characters and surrogates of every value are
written as escapes (``\\x0a``, ``\\udcff``) before any handler sees it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["audit_log", "one_line"]

_UNSAFE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def one_line(value: Any) -> Any:
    """``value`` with its control characters and surrogates escaped (a str),
    else as it is."""
    return _UNSAFE.sub(_escape, value) if isinstance(value, str) else value


class OneLine(logging.Filter):
    """Escapes a record's message and arguments (see the module's docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = one_line(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(one_line(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: one_line(v) for k, v in record.args.items()}
        return True


audit_log = logging.getLogger("disque.console.audit")
audit_log.addFilter(OneLine())
# The console's own log names users and queues too (a refused login's name).
logging.getLogger("disque.console").addFilter(OneLine())
