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

from eoguard.codec import EnvelopeCodec
from eoguard.envelope import now_ms
from eoguard.stack import create_topics
from eoguard.stack.feed import envelope, produce
from tests.consumer_kit import CODEC
from tests.integration.test_hostile_input import _SLOW, ALWAYS_BAD, LIMITS, broken, verdict

pytestmark = [pytest.mark.spark, pytest.mark.integration]


SOON_MS = 300_000  # a valid record expiring within this may expire before the job reads it


def _expires_within(value: bytes, ms: int) -> bool:
    return EnvelopeCodec().decode(value).expires_at_ms <= now_ms() + ms


@settings(max_examples=5, derandomize=True, database=None, deadline=None,
          suppress_health_check=_SLOW, print_blob=True)
@given(records=st.lists(broken(), min_size=5, max_size=25))
def test_the_job_dead_letters_hostile_records_and_outputs_the_good_ones_once(
        records: list[tuple[str, Any]], spark: Any, kafka_bootstrap: str, job_options: Any,
        run_job: Any, redis_client: redis.Redis, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:10]
    topic = f"hostile-spark-{run}"
    create_topics(kafka_bootstrap, {topic: 1})
    values: list[Any] = []
    expect_out: list[str] = []
    refused: dict[int, str] = {}  # offset -> kind
    expired: set[int] = set()
    soon: dict[int, str] = {}  # offset -> id: valid now, expired by the job's read or not
    for kind, value in records:
        good = envelope()
        values.append(CODEC.encode(good))
        expect_out.append(good.id)
        handled_as = verdict(value)
        if kind in ALWAYS_BAD:
            assert handled_as is None, f"a {kind} record passed the input rules"
        if handled_as is None:
            refused[len(values)] = kind
        elif handled_as == "expired":
            expired.add(len(values))
        elif _expires_within(value, SOON_MS):  # a bit flip in the expiry: Spark may be later
            soon[len(values)] = handled_as
        else:
            expect_out.append(handled_as)
        values.append(value)
    values.append(CODEC.encode(last := envelope()))
    expect_out.append(last.id)
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
