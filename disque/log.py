"""Log lines in the original's format: ``pid:M 21 Nov 2026 12:00:00.123 * message``.

Levels map to the ``loglevel`` directive: debug ``.``, verbose ``-``,
notice ``*``, warning ``#``.
"""

from __future__ import annotations

import logging
import os
import sys
import time

VERBOSE = 15
NOTICE = logging.INFO
LEVELS = {"debug": logging.DEBUG, "verbose": VERBOSE, "notice": NOTICE, "warning": logging.WARNING}
_MARKS = {logging.DEBUG: ".", VERBOSE: "-", logging.INFO: "*", logging.WARNING: "#",
          logging.ERROR: "#", logging.CRITICAL: "#"}

logging.addLevelName(VERBOSE, "VERBOSE")


class DisqueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%d %b %Y %H:%M:%S", time.localtime(record.created))
        millis = int(record.msecs)
        mark = _MARKS.get(record.levelno, "*")
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{os.getpid()}:M {stamp}.{millis:03d} {mark} {text}"


def setup_logging(level: str, logfile: str) -> None:
    root = logging.getLogger("disque")
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handler: logging.Handler = (logging.FileHandler(logfile) if logfile
                                else logging.StreamHandler(sys.stdout))
    handler.setFormatter(DisqueFormatter())
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    root.propagate = False


def set_level(level: str) -> None:
    logging.getLogger("disque").setLevel(LEVELS[level])


class RateLimitedLog:
    """At most one warning per ``period_s``; the next one says how many were not logged."""

    __slots__ = ("_logger", "_next", "_period", "_suppressed")

    def __init__(self, logger: logging.Logger, period_s: float = 10.0) -> None:
        self._logger = logger
        self._period = period_s
        self._next = 0.0
        self._suppressed = 0

    def warning(self, text: str) -> None:
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        self._next = now + self._period
        if self._suppressed:
            text += f" ({self._suppressed} more since the last report, not logged)"
            self._suppressed = 0
        self._logger.warning("%s", text)
