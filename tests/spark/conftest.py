"""Spark connector tests: skipped as a whole without the 'spark' extra.

The ``spark`` session fixture and ``unused_port`` live in tests/conftest.py
(the example-pipeline tests use them too).
"""

from __future__ import annotations

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="the Spark connector tests need the 'spark' extra: pip install -e '.[spark]'")
