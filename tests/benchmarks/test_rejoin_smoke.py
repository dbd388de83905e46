"""``python3 -m benchmarks.rejoin`` runs end to end: a restarted node is
counted reachable and takes copies again, for ours and (with
``DISQUE_REFERENCE_SERVER``) the original; ours is not slower from the
node answering its port (the speed the benchmark reports is not asserted
beyond that: the machine is shared)."""

from __future__ import annotations

from benchmarks.rejoin import run
from tests.support.cluster import reference_server


def test_rejoin_smoke() -> None:
    result = run(trials=1, node_timeout=1000)
    impls = ["ours"] + (["original"] if reference_server() else [])
    assert set(result["median_ms"]) == set(impls)
    for impl in impls:
        (trial,) = result["trials"][impl]
        assert {"start", "addjob", "flags"} <= set(trial), trial
        assert set(trial["flagged"]) <= {"fail?", "fail"}
    # Ours takes a copy at once once its port answers: no -NOREPL timeout
    # (a copy sent before the restarted node linked back cost 1 s).
    assert result["trials"]["ours"][0]["addjob"] < 900
