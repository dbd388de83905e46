"""``fetchAhead``: the driver's one background thread, and when staging ahead pays.

While Spark runs batch n, the thread acknowledges batch n-1 (committed) and
then, when batch n was full (a backlog), fetches and stages batch n+1, so
the next ``latestOffset`` returns at once.  One thread, so its tasks run one
at a time in the order they were submitted and never race each other;
Spark's calls wait for them where the delivery contract needs it (no GETJOB
before the ACKs of the committed batches are done: see
:meth:`.driver.DriverSide.latest`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["AHEAD_TRIGGERS", "FetchAhead"]

#: A batch staged ahead is acknowledged about this many triggers after it
#: was fetched (returned at the next one, acknowledged at the one after,
#: plus the ACK itself).
AHEAD_TRIGGERS = 2.5
#: Before two triggers have been seen, a trigger is taken to last this many
#: times what the first ``latestOffset`` took so far (its fetch and staging;
#: Spark then runs the batch, about as long again on a loaded machine), and
#: at least :data:`FIRST_TRIGGER_MIN_S` (Spark's own cost of a trigger).
FIRST_TRIGGER_GUESS = 4.0
FIRST_TRIGGER_MIN_S = 1.0


class FetchAhead:
    """The background thread, the batch being staged ahead, and the trigger's pace."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[Any]] = []
        self._ahead: Future[bool] | None = None
        #: Seconds between the last two triggers (latestOffset calls).
        self.trigger_s: float | None = None
        self._last_trigger_at: float | None = None

    def trigger(self) -> None:
        """A trigger began (``latestOffset``): measure the pace."""
        now = time.monotonic()
        if self._last_trigger_at is not None:
            self.trigger_s = now - self._last_trigger_at
        self._last_trigger_at = now

    def pays(self, lease_s: float) -> bool:
        """Would a batch staged ahead be acknowledged before its first heartbeat?

        A batch staged ahead lives about :data:`AHEAD_TRIGGERS` triggers
        longer, and a heartbeat costs the node about what fetching the job
        did (~4 us each, even sent as WORKINGS), more than starting the
        fetch early saves on a machine whose cores are busy.
        """
        trigger_s = self.trigger_s
        if trigger_s is None:
            # The first trigger: a 2-batch availableNow run has no second
            # one to measure, and it is where staging ahead saves the most.
            if self._last_trigger_at is None:
                return False
            trigger_s = max(FIRST_TRIGGER_MIN_S,
                            FIRST_TRIGGER_GUESS * (time.monotonic() - self._last_trigger_at))
        return AHEAD_TRIGGERS * trigger_s < lease_s / 2

    def submit(self, task: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="disque-source")
        future = self._pool.submit(task, *args)
        self._pending.append(future)
        self._reap()
        return future

    def stage(self, task: Callable[..., bool], *args: Any) -> None:
        """Run ``task`` (staging the next batch) after what was submitted before."""
        self._ahead = self.submit(task, *args)

    def _reap(self) -> None:
        """Forget finished tasks; one that failed fails the caller."""
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for future in done:
            future.result()

    def wait(self) -> None:
        """Until every task submitted so far is done."""
        for future in list(self._pending):
            future.result()
        self._reap()

    def wait_staged(self) -> None:
        """Until the batch being staged ahead (if any) is staged."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.result()

    def close(self) -> None:
        """Let a running ACK or fetch finish: a batch staged ahead stays
        staged and leased for the next run, like one staged before a crash."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
