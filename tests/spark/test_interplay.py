"""The job and a GuardedConsumer in one scope share the Redis dedup keys: whichever handles a
message first, the other drops it."""

from __future__ import annotations

from collections import Counter

import pytest

from eoguard.guard.consumer import GuardedConsumer
from eoguard.guard.handler import HandlerContext
from tests.consumer_kit import consumer_config, drain, envelope, produce

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
