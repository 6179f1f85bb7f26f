"""Fixtures of the Spark job tests: job options, data, output (the session is in tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from eoguard.codec import InputLimits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eoguard_spark import JobOptions

@pytest.fixture
def job_options(kafka_bootstrap: str, redis_url: str, key_prefix: str, tmp_path: Path
                ) -> Callable[..., JobOptions]:
    """``JobOptions`` for one topic list, with this test's Redis prefix and directories."""
    from eoguard_spark import JobOptions  # noqa: PLC0415

    def make(topics: list[str], **overrides: Any) -> JobOptions:
        name = uuid.uuid4().hex[:8]
        values: dict[str, Any] = {
            "bootstrap": kafka_bootstrap, "topics": tuple(topics), "scope": "app",
            "checkpoint": str(tmp_path / f"cp-{name}"), "output_path": str(tmp_path / "out"),
            "dead_letter_path": str(tmp_path / "dead"), "redis_url": redis_url,
            "key_prefix": key_prefix, "available_now": True, "busy_wait_s": 2.0,
            "lease_s": 60.0, "grace_s": 60.0,
            # bounded batches: the Redis mode's one-pass path (one_pass.ONE_PASS_MAX_ROWS)
            "max_offsets_per_trigger": 10_000,
            "input_limits": InputLimits(clock_skew_ms=60_000),  # within grace_s
        }
        values.update(overrides)
        return JobOptions(**values)

    return make


@pytest.fixture
def run_job(spark: SparkSession) -> Callable[..., list[Any]]:
    """Run the job with ``available_now`` to the end, and its last background outbox
    acknowledgement; returns each batch's BatchStats."""
    from eoguard_spark import build_query, wait_for_acks  # noqa: PLC0415

    def run(options: JobOptions, **kwargs: Any) -> list[Any]:
        stats: list[Any] = []
        query = build_query(spark, options, on_batch=stats.append, **kwargs)
        try:
            assert query.awaitTermination(300), "the job did not finish within 300 s"
            wait_for_acks(query, 60)
        finally:
            query.stop()
        assert query.exception() is None, query.exception()
        return stats

    return run
