"""The job and a GuardedConsumer in one scope share the Redis dedup keys: whichever handles a
message first, the other drops it, one after the other and at the same time on one topic."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from pyspark.sql import DataFrame

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack.feed import envelope, produce
from tests.consumer_kit import ConsumerThread, consumer_config, drain

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_job_and_guarded_consumer_in_one_scope_handle_each_message_once(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job) -> None:
    topic_a, topic_b = new_topic(2), new_topic(2)
    by_consumer = [envelope(b"c%d" % i) for i in range(15)]
    by_job = [envelope(b"j%d" % i) for i in range(15)]
    produce(kafka_bootstrap, topic_a, by_consumer)
    produce(kafka_bootstrap, topic_b, by_job)
    handled: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        handled.append(ctx.message_id)

    config = consumer_config(kafka_bootstrap, redis_url, [topic_a], prefix=key_prefix,
                             scope="app", dead_letter_topic=new_topic(1, prefix="dlq"))
    with GuardedConsumer(config, handler=handler) as consumer:
        # 1. The consumer handles topic A first.
        drain([consumer], lambda: len(handled) >= len(by_consumer))
        assert Counter(handled) == Counter(e.id for e in by_consumer)

        # 2. The job reads both topics in the same scope: A's messages are done, so only B's
        #    reach its output (A's records, and copies of them resent into B, are dropped).
        produce(kafka_bootstrap, topic_b, [e.with_attempt(2) for e in by_consumer[:5]])
        options = job_options([topic_a, topic_b], scope="app")
        stats = run_job(options)
        out = Counter(r["id"] for r in spark.read.parquet(options.output_path).collect())
        assert out == Counter(e.id for e in by_job)
        assert sum(b.rows.get("duplicate", 0) for b in stats) == 20

        # 3. Copies of the job's messages reach the consumer: done by the job, so dropped.
        produce(kafka_bootstrap, topic_a, [e.with_attempt(2) for e in by_job])
        drain([consumer], lambda: consumer.stats().duplicates >= len(by_job))
        assert consumer.stats().duplicates == len(by_job)
        assert Counter(handled) == Counter(e.id for e in by_consumer)  # nothing new handled
    print(f"consumer handled={len(handled)} job wrote={sum(out.values())} "
          f"consumer duplicates={consumer.stats().duplicates}")


def test_job_and_guarded_consumer_reading_one_topic_at_once_handle_each_message_once(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job) -> None:
    """Both read the same records at the same time: their claim owners differ by reader (the
    consumer's group id, the job's query), so each message is handled by exactly one of them.

    The job starts once the consumer holds its first claims, and the consumer's first handler
    call waits for the job's first micro-batch to be written, so both sides surely take part:
    the job waits on the consumer's claims, skips them as busy (the consumer handles them),
    and later batches race with the consumer record by record.
    """
    topic = new_topic(4)
    sent = [envelope(b"x%d" % i) for i in range(400)]
    for p in range(4):
        produce(kafka_bootstrap, topic, sent[p::4], partition=p)
    handled: list[str] = []
    consumer_holds_claims = threading.Event()
    job_batch_done = threading.Event()

    def handler(ctx: HandlerContext) -> None:
        if not handled:
            consumer_holds_claims.set()
            assert job_batch_done.wait(180), "the job's first batch did not finish"
        handled.append(ctx.message_id)
        time.sleep(0.005)  # keep the consumer busy while the job's batches run

    config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix, scope="app",
                             dead_letter_topic=new_topic(1, prefix="dlq"), batch_size=25,
                             busy_wait_s=20.0)

    options = job_options([topic], scope="app", max_offsets_per_trigger=100, busy_wait_s=2.0)

    def first_batch_written(_df: DataFrame, _batch_id: int) -> None:
        job_batch_done.set()  # the batch's claims are settled and its output committed

    consumer = ConsumerThread(config, handler)
    try:
        assert consumer_holds_claims.wait(120), f"the consumer claimed nothing: {consumer.failure}"
        stats = run_job(options, foreach_batch=first_batch_written)
        out = Counter(r["id"] for r in spark.read.parquet(options.output_path).collect())
        everything = Counter(e.id for e in sent)
        deadline = time.monotonic() + 120
        while Counter(handled) + out != everything and time.monotonic() < deadline \
                and consumer.failure is None:
            time.sleep(0.2)
        time.sleep(1.0)  # a few more polls: nothing may be handled twice after that either
    finally:
        cstats = consumer.stop()
    rows: Counter[str] = Counter()
    for batch in stats:
        rows.update(batch.rows)
    print(f"same topic at once: consumer handled={len(handled)} job wrote={sum(out.values())} "
          f"total={len(handled) + sum(out.values())} of {len(sent)}; job statuses={dict(rows)}; "
          f"consumer duplicates={cstats.duplicates} busy_waits={cstats.busy_waits} "
          f"busy_skipped={cstats.busy_skipped}")
    assert Counter(handled) + out == everything, "every message exactly once in total"
    assert not set(handled) & set(out)
    assert handled, "the consumer handled some of the messages"
    assert out, "the job wrote some of the messages"
