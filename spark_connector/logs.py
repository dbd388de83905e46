"""The source's log lines in the driver's console (the ``logLevel`` option)."""

from __future__ import annotations

import logging
import sys

__all__ = ["log_to_stderr"]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def log_to_stderr(level: str) -> None:
    """Show the source's log lines in the driver's console (``logLevel`` option).

    The driver-side methods run in a Python worker that Spark starts, whose
    stderr ends up in the driver's output; nobody configures logging there,
    so the connector does, once, unless the application already did.
    """
    logger = logging.getLogger("spark_connector")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
