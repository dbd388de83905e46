"""The AOF's background thread: fsyncs and closes that the event loop must
never wait for."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["BackgroundIO", "close_quietly", "fsync_dir"]

log = logging.getLogger("disque.aof")


class BackgroundIO:
    """One thread for the slow file operations: fsync, closing replaced files.

    Jobs run in submission order, so an fsync of a descriptor always runs
    before its close.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.submitted = 0   # written by the loop thread only
        self.done = 0        # written by the I/O thread only

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aof-bio", daemon=True)
            self._thread.start()
        self.submitted += 1
        self._queue.put((fn, args))

    @property
    def busy(self) -> bool:
        return self.submitted != self.done

    def _run(self) -> None:
        while True:
            fn, args = self._queue.get()
            if fn is None:
                self.done += 1
                return
            try:
                fn(*args)
            except Exception:  # pragma: no cover - logged, the thread goes on
                log.exception("Error in background AOF job")
            self.done += 1

    def drain(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        finished = threading.Event()
        self.submit(finished.set)
        finished.wait(timeout)


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
