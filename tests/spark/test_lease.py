"""A micro-batch slower than its lease keeps its claims: the driver renews the batch's records
while it runs, so a GuardedConsumer of the scope reading the same records meanwhile finds them
busy, then done, and handles none of them."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from pyspark.sql import DataFrame

from eoguard.consumer.handler import HandlerContext
from eoguard.stack.feed import envelope, produce
from tests.consumer_kit import ConsumerThread, consumer_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

LEASE_S = 2.0
SINK_S = 4 * LEASE_S  # the slow sink: four leases


def test_a_batch_slower_than_its_lease_loses_no_claim_to_a_consumer(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job) -> None:
    topic = new_topic(2)
    sent = [envelope(b"s%d" % i) for i in range(60)]
    produce(kafka_bootstrap, topic, sent)
    handled: list[str] = []
    in_sink = threading.Event()

    def handler(ctx: HandlerContext) -> None:
        handled.append(ctx.message_id)

    # The consumer waits on busy claims far longer than the batch takes: without renewals it
    # would take the batch's claims over once their lease lapsed, and handle the messages.
    config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix, scope="app",
                             dead_letter_topic=new_topic(1, prefix="dlq"), busy_wait_s=120.0)

    def slow_sink(_df: DataFrame, _batch_id: int) -> None:
        in_sink.set()  # claimed and written to Parquet; the done mark comes after this
        time.sleep(SINK_S)

    consumer = ConsumerThread(config, handler, after=in_sink)  # once the batch holds claims
    try:
        options = job_options([topic], scope="app", lease_s=LEASE_S)
        stats = run_job(options, foreach_batch=slow_sink)
        out = Counter(r["id"] for r in spark.read.parquet(options.output_path).collect())
        time.sleep(3.0)  # the consumer meets every record after the done mark, too
    finally:
        cstats = consumer.stop()
    [batch] = stats
    print(f"slow sink ({SINK_S} s, lease {LEASE_S} s): job wrote={sum(out.values())}, "
          f"renewals={batch.lease_renewals}, lapsed={batch.records_lapsed}; consumer "
          f"handled={len(handled)} duplicates={cstats.duplicates} busy_waits={cstats.busy_waits}")
    assert out == Counter(e.id for e in sent)
    assert batch.lease_renewals >= SINK_S / LEASE_S * 2, "renewed about every lease/3"
    assert batch.records_lapsed == 0
    assert cstats.busy_waits > 0, "the consumer met the batch's claims while it ran"
    assert handled == [], "no claim of the batch lapsed to the consumer"
    assert cstats.duplicates == len(sent)
