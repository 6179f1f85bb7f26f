"""The job on plain topics (issue 35), real Kafka, Redis and Spark: a topic of plain JSON orders
with copies, envelopes of some of the same orders and two broken records comes out one row per
order with the broken records as dead letters; a GuardedConsumer of the scope with the same
rules then drops the orders the job wrote and handles only new ones."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from eoguard import Lifetime, PlainRecords
from eoguard.codec.plain import id_from_field
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.consumer.state import ConsumerStats
from eoguard.envelope import message_id_for
from eoguard.stack.feed import envelope, produce
from eoguard_spark import PlainOptions
from tests.consumer_kit import consumer_config, drain

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def order_value(number: int) -> bytes:
    return json.dumps({"order": number, "total_cents": 100 * number}).encode()


def order_id(number: int) -> str:
    return message_id_for("orders", str(number))


def job_output(spark: Any, options: Any, stats: list[Any]) -> tuple[Counter[str], list[Any]]:
    """The ids the job wrote (counted) and its dead-letter rows; prints their counts."""
    out = Counter(r["id"] for r in spark.read.parquet(options.output_path).collect())
    dead = spark.read.parquet(options.dead_letter_path).collect()
    statuses: Counter[str] = Counter()
    for batch in stats:
        statuses.update(batch.rows)
    print(f"output rows={sum(out.values())} distinct={len(out)} dead={len(dead)} "
          f"statuses={dict(statuses)}")
    return out, dead


def consumer_of_the_scope(kafka_bootstrap: str, redis_url: str, key_prefix: str,
                          new_topic: Callable[..., str], values: list[bytes],
                          rules: PlainRecords, *, handles: int) -> tuple[list[int], ConsumerStats]:
    """A GuardedConsumer of the job's scope ("app") with ``rules`` over a new topic of
    ``values``: the orders it handled (until ``handles`` and every value polled), its stats."""
    other = new_topic(1)
    produce(kafka_bootstrap, other, values)
    handled: list[int] = []

    def handler(ctx: HandlerContext) -> None:
        handled.append(ctx.payload["order"])

    config = consumer_config(kafka_bootstrap, redis_url, [other], prefix=key_prefix,
                             scope="app", dead_letter_topic=new_topic(1, prefix="dlq"),
                             plain_records=rules)
    with GuardedConsumer(config, handler=handler) as consumer:
        drain([consumer], lambda: consumer.stats().polled >= len(values)
              and len(handled) >= handles)
        seen = consumer.stats()
    print(f"consumer handled={len(handled)} duplicates={seen.duplicates} "
          f"dead_lettered={seen.dead_lettered}")
    return handled, seen


def test_plain_and_mixed_topic_once_per_order_with_a_consumer_in_the_scope(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job) -> None:
    topic = new_topic(2)
    produce(kafka_bootstrap, topic, [order_value(n) for n in range(40)], partition=0)
    produce(kafka_bootstrap, topic, [order_value(n) for n in range(10)], partition=1)  # copies
    # Envelopes of orders 30-49 under the same business-key ids (30-39 come both ways).
    produce(kafka_bootstrap, topic, [envelope(order_value(n), message_id=order_id(n))
                                     for n in range(30, 50)], partition=1)
    produce(kafka_bootstrap, topic, [b'{"order": 5', b'{"total_cents": 1}'], partition=0)
    plain = PlainOptions(format="json", id_namespace="orders", ttl_s=600, id_field="order",
                         json_schema="order bigint, total_cents bigint")
    options = job_options([topic], scope="app", plain=plain)

    stats = run_job(options)

    out, dead = job_output(spark, options, stats)
    assert out == Counter(order_id(n) for n in range(50))
    assert sorted(r["reason"] for r in dead) == [
        "plain record: id field 'order' is missing or null",
        "plain record: the value is not valid JSON of json_schema"]
    assert {bytes(r["value"]) for r in dead} == {b'{"order": 5', b'{"total_cents": 1}'}

    # A GuardedConsumer of the scope, keyed by the same rule: copies of what the job wrote
    # are duplicates; only the new orders are handled.
    rules = PlainRecords(deserializer=json.loads, id_rule=id_from_field("orders", "order"),
                         lifetime=Lifetime(ttl_s=600))
    handled, seen = consumer_of_the_scope(
        kafka_bootstrap, redis_url, key_prefix, new_topic,
        [order_value(n) for n in [*range(20), *range(50, 60)]], rules, handles=10)
    assert Counter(handled) == Counter(range(50, 60))
    assert seen.duplicates == 20


def test_raw_records_keyed_by_a_header_come_out_once(
        spark, new_topic, kafka_bootstrap, job_options, run_job) -> None:
    from confluent_kafka import Producer  # noqa: PLC0415

    topic = new_topic(2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    keys = [f"\u00fc-{n}".encode() for n in range(12)]
    for n, key in enumerate([*keys, *keys[:5]]):  # copies of five, in the other partition
        producer.produce(topic, b"\x00raw-%d" % n, partition=n % 2,
                         headers=[("order-id", b"stale"), ("order-id", key)])
    producer.produce(topic, b"\x00no id", partition=0, headers=[("other", b"1")])
    assert producer.flush(30) == 0
    plain = PlainOptions(format="raw", id_namespace="orders", ttl_s=600, id_header="order-id")
    options = job_options([topic], scope="app", plain=plain)

    run_job(options)

    out = Counter(r["id"] for r in spark.read.parquet(options.output_path).collect())
    dead = spark.read.parquet(options.dead_letter_path).collect()
    print(f"output rows={sum(out.values())} dead={len(dead)}")
    assert out == Counter(message_id_for("orders", key) for key in keys)
    assert [r["reason"] for r in dead] == ["plain record: no header 'order-id' (the id's key)"]
