"""``python3 -m benchmarks.client_tracing`` runs end to end: a client under
callgrind adds jobs with OpenTelemetry absent, imported without a provider,
and with the SDK's provider; the counts are per ``add_job`` (no speed
asserted: the machine is shared), and tracing costs more than not tracing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.client_tracing import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("valgrind") is None,
                    reason="needs valgrind (Debian package valgrind) to count instructions")
def test_client_tracing_smoke() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="needs the dev extra: opentelemetry-sdk")
    result = run(ROOT, ["none", "api", "sdk"], small=20, large=120, cpu_calls=200)
    for mode in ("none", "api", "sdk"):
        assert result[mode]["instructions_per_add_job"] > 10_000, result
        assert result[mode]["cpu_us_per_add_job"] > 0, result
    assert (result["sdk"]["instructions_per_add_job"]
            > result["none"]["instructions_per_add_job"]), result
