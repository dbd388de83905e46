"""SIGKILL at random moments while producers add and acknowledge jobs.

Every job whose ADDJOB returned an ID must be there after the restart unless
its ACKJOB returned; no job whose ACKJOB returned may come back.  Operations
in flight at the moment of the kill (sent, no reply) may go either way.
"""

from __future__ import annotations

import random
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.persistence.conftest import persistence, present
from tests.support.process import wait_for

ROUNDS = 5
PRODUCERS = 2


class Producer(threading.Thread):
    """ADDJOB one at a time; every 4th job ACKs an earlier one."""

    def __init__(self, port: int, name: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis(port=port, protocol=2, socket_timeout=10,
                                  retry=Retry(NoBackoff(), 0))
        self.label = name
        self.added: list[bytes] = []      # ADDJOB answered with this ID
        self.acked: list[bytes] = []      # ACKJOB answered
        self.uncertain: list[bytes] = []  # ACKJOB sent, no answer
        self.error: Exception | None = None

    def run(self) -> None:
        rng = random.Random(self.label)
        n = 0
        try:
            while True:
                n += 1
                job_id = self.client.execute_command("ADDJOB", "crashq", f"{self.label}-{n}",
                                                     0, "RETRY", 300)
                self.added.append(job_id)
                if n % 4 == 0:
                    victim = self.added[rng.randrange(len(self.added))]
                    if victim in self.acked:
                        continue
                    self.uncertain.append(victim)
                    self.client.execute_command("ACKJOB", victim)
                    self.uncertain.pop()
                    self.acked.append(victim)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
            self.error = err
        finally:
            self.client.close()


def crash_rounds(node, rounds: int, last_target: int = 0) -> dict[str, int]:
    rng = random.Random(1234)
    added: set[bytes] = set()
    acked: set[bytes] = set()
    uncertain: set[bytes] = set()
    lost_total = 0
    back_total = 0
    r = node.client()
    for round_no in range(rounds):
        producers = [Producer(node.port, f"r{round_no}p{i}") for i in range(PRODUCERS)]
        for p in producers:
            p.start()
        target = rng.randint(200, 1500)
        if last_target and round_no == rounds - 1:
            target = last_target
        wait_for(lambda ps=producers, t=target: sum(len(p.added) for p in ps) >= t,
                 timeout=60, message="the producers")
        fsync_lag = persistence(r).get("aof_fsync_max_lag_ms", 0)
        node.kill()                       # SIGKILL at a random moment of the load
        for p in producers:
            p.join(10)
            assert not p.is_alive()
            added.update(p.added)
            acked.update(p.acked)
            uncertain.update(p.uncertain)
        node.start(port=node.port)
        r = node.client()
        must_exist = added - acked - uncertain
        must_not_exist = acked
        found = present(r, sorted(must_exist | must_not_exist))
        lost = must_exist - found
        back = must_not_exist & found
        lost_total = max(lost_total, len(lost))
        back_total = max(back_total, len(back))
        assert not lost, f"round {round_no}: {len(lost)} acknowledged jobs lost"
        assert not back, f"round {round_no}: {len(back)} acked jobs came back: {sorted(back)}"
        # Uncertain ACKs settle now, for the next rounds.
        for job_id in present(r, sorted(uncertain)):
            r.execute_command("ACKJOB", job_id)
        acked |= uncertain
        uncertain.clear()
    return {"added": len(added), "acked": len(acked), "max_lost": lost_total,
            "max_acked_back": back_total, "last_round_fsync_max_lag_ms": fsync_lag}


@pytest.mark.slow
def test_sigkill_rounds_appendfsync_always(server_factory, record_property) -> None:
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    result = crash_rounds(node, ROUNDS)
    record_property("always", result)
    print(f"\nappendfsync always, {ROUNDS} SIGKILL rounds: {result}")
    assert result["max_lost"] == 0 and result["max_acked_back"] == 0


@pytest.mark.slow
def test_sigkill_rounds_appendfsync_everysec(server_factory, record_property) -> None:
    """everysec writes before replying too: a process crash loses nothing.

    (Only an OS crash or power loss can lose the records not fsynced yet:
    ``aof_fsync_max_lag_ms`` is the longest such window seen.)
    """
    node = server_factory("--appendonly", "yes", "--appendfsync", "everysec")
    result = crash_rounds(node, ROUNDS, last_target=30000)
    record_property("everysec", result)
    print(f"\nappendfsync everysec, {ROUNDS} SIGKILL rounds: {result}")
    assert result["max_lost"] == 0 and result["max_acked_back"] == 0
