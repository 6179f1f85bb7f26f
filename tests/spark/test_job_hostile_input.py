"""Hostile input thrown at the Spark job: the records of the consumer's property test
(tests/integration/test_hostile_input.py), drawn the same way, read by Spark's Kafka source.

Each example writes a fresh topic of good envelopes with broken records between them and runs
the job (Redis dedup, available-now) to the end. Then: the query ends without an exception,
every refused record is in the dead-letter output as ``malformed`` with a reason, every valid
record reaches the output once, a bit flip that left a valid but expired envelope is
dead-lettered as ``expired``, and no Redis key is built from a refused record. A Spark run
costs seconds, so the ``ci`` profile draws 5 examples of up to 25 broken records each.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from eoguard.stack import create_topics
from eoguard.stack.feed import produce
from tests.integration.test_hostile_input import _SLOW, LIMITS, broken, plant

pytestmark = [pytest.mark.spark, pytest.mark.integration]


SOON_MS = 300_000  # a valid record expiring within this may expire before the job reads it


@settings(max_examples=5, derandomize=True, database=None, deadline=None,
          suppress_health_check=_SLOW, print_blob=True)
@given(records=st.lists(broken(), min_size=5, max_size=25))
def test_the_job_dead_letters_hostile_records_and_outputs_the_good_ones_once(
        records: list[tuple[str, Any]], spark: Any, kafka_bootstrap: str, job_options: Any,
        run_job: Any, redis_client: redis.Redis, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:10]
    topic = f"hostile-spark-{run}"
    create_topics(kafka_bootstrap, {topic: 1})
    planted = plant(records, soon_ms=SOON_MS)
    values, expect_out, refused = planted.values, planted.handled, planted.refused
    expired, soon = planted.expired, planted.soon
    produce(kafka_bootstrap, topic, values, partition=0)

    prefix = f"hs{run}"
    options = job_options([topic], key_prefix=prefix, input_limits=LIMITS,
                          output_path=str(tmp_path / f"out-{run}"),
                          dead_letter_path=str(tmp_path / f"dead-{run}"))
    run_job(options)  # fails on a query exception

    out = [r["id"] for r in spark.read.parquet(options.output_path).select("id").collect()]
    dead = {r["offset"]: r for r in spark.read.parquet(options.dead_letter_path).collect()} \
        if refused or expired or soon else {}
    for offset, id_ in soon.items():  # in exactly one of the two
        assert (id_ in out) != (offset in dead), (offset, id_)
        if offset in dead:
            expired.add(offset)
        else:
            expect_out.append(id_)
    assert Counter(out) == Counter(expect_out)
    assert sorted(dead) == sorted([*refused, *expired]), \
        f"dead-lettered {sorted(dead)}, refused {refused}, expired {sorted(expired)}"
    for offset, row in dead.items():
        want = "expired" if offset in expired else "malformed"
        assert row["status"] == want, (refused.get(offset), row["reason"])
        assert row["reason"], refused.get(offset)
    keyed = {k.decode().rsplit(":", 1)[1]
             for k in redis_client.scan_iter(f"{prefix}:dc:*", count=1000)}
    assert keyed == set(expect_out)
