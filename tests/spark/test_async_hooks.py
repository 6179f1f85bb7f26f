"""The Spark job's hooks are synchronous: an ``async def`` one is refused by build_query, and
a plain one that returns a coroutine fails its batch before the batch counts as done."""

from __future__ import annotations

import inspect
from collections.abc import Coroutine
from typing import Any

import pytest
from pyspark.sql import DataFrame

from eoguard.errors import ConfigError
from eoguard.stack.feed import envelope, produce
from eoguard_spark import build_query

pytestmark = pytest.mark.spark

FIX = "make it a plain def"


async def async_foreach_batch(df: DataFrame, batch_id: int) -> None:
    return None


async def async_transform(rows: DataFrame) -> DataFrame:
    return rows


async def async_on_batch(stats: Any) -> None:
    return None


@pytest.mark.parametrize(("name", "hook"), [("foreach_batch", async_foreach_batch),
                                            ("transform", async_transform),
                                            ("on_batch", async_on_batch)])
def test_an_async_hook_is_refused_by_build_query(spark, new_topic, job_options, name: str,
                                                 hook: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        build_query(spark, job_options([new_topic(1)]), **{name: hook})
    assert str(refused.value).startswith(f"{name} is an async def callable")
    assert FIX in str(refused.value)
    assert spark.streams.active == []  # refused before a query started


def test_a_hook_returning_a_coroutine_fails_its_batch_and_loses_nothing(
        new_topic, kafka_bootstrap, job_options, run_job) -> None:
    topic = new_topic(1)
    sent = [envelope(b"a%d" % i) for i in range(5)]
    produce(kafka_bootstrap, topic, sent)
    options = job_options([topic], output_path=None)
    returned: list[Coroutine[Any, Any, None]] = []

    def hook(df: DataFrame, batch_id: int) -> Any:  # a plain def that hands back a coroutine
        returned.append(async_foreach_batch(df, batch_id))
        return returned[-1]

    with pytest.raises(Exception, match="foreach_batch returned an awaitable"):
        run_job(options, foreach_batch=hook)
    assert returned
    assert all(inspect.getcoroutinestate(c) == inspect.CORO_CLOSED for c in returned)

    seen: list[str] = []
    again = run_job(options, foreach_batch=lambda df, _: seen.extend(
        r["id"] for r in df.select("id").collect()))
    # Not done the first time: the replay re-owns its claims (MINE) and hands every row over.
    assert sorted(seen) == sorted(e.id for e in sent)
    assert sum(b.rows.get("mine", 0) for b in again) == len(sent)
