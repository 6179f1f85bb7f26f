"""The job on plain Avro topics (issue 35), real Kafka, Redis and Spark: orders written with
fastavro's schemaless_writer, with Schema Registry framing (and envelopes of some of the same
orders) or without, with copies, come out one row per order; a body that is not Avro of the
schema, a wrong magic byte and a null id are dead letters with their reasons, the records
around them handled. A GuardedConsumer of the scope reading Avro with fastavro and
``id_from_field`` then drops the orders the job wrote and handles only new ones."""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from eoguard import Lifetime, PlainRecords
from eoguard.codec.plain import id_from_field
from eoguard.stack.feed import envelope, produce
from eoguard_spark import PlainOptions
from tests.spark.test_job_plain import consumer_of_the_scope, job_output, order_id

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order", "type": ["null", "long"]}, {"name": "total_cents", "type": "long"},
    {"name": "note", "type": "string"}]}
PARSED = parse_schema(ORDER)
HEADER = b"\x00" + (7).to_bytes(4, "big")  # Schema Registry framing: magic 0, schema id 7


def order_body(number: int | None) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, PARSED, {"order": number, "total_cents": 100 * (number or 0),
                                    "note": f"order {number}"})
    return out.getvalue()


def registry_reader(raw: bytes) -> Any:
    """A consumer's deserializer for Schema Registry framing, as confluent-kafka's
    AvroDeserializer reads it with the same schema (magic byte checked, id skipped)."""
    if raw[:1] != b"\x00" or len(raw) < 5:
        raise ValueError(f"not Schema Registry framing: starts with {raw[:1].hex()}")
    return schemaless_reader(io.BytesIO(raw[5:]), PARSED)


BAD = {  # a framed record that is broken -> the job's reason
    HEADER + order_body(5)[:-3]:
        "plain record: the value is not a valid Avro record of avro_schema",
    b"\x01" + HEADER[1:] + order_body(6): "plain record: bad magic: starts with 01, expected 00 "
                                          "(Schema Registry framing)",
    HEADER + order_body(None): "plain record: id field 'order' is missing or null",
}


def test_registry_framed_orders_once_with_a_consumer_in_the_scope(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job) -> None:
    topic = new_topic(2)
    bad = list(BAD)
    # Orders 0-39 in partition 0 with a broken record after every tenth; copies of 0-9 and
    # envelopes of 30-49 (under the same business-key ids) in partition 1.
    first = [HEADER + order_body(n) for n in range(40)]
    produce(kafka_bootstrap, topic, [*first[:10], bad[0], *first[10:20], bad[1], *first[20:30],
                                     bad[2], *first[30:]], partition=0)
    produce(kafka_bootstrap, topic, [HEADER + order_body(n) for n in range(10)], partition=1)
    produce(kafka_bootstrap, topic, [envelope(order_body(n), message_id=order_id(n))
                                     for n in range(30, 50)], partition=1)
    plain = PlainOptions(format="avro", id_namespace="orders", ttl_s=600, id_field="order",
                         avro_schema=json.dumps(ORDER), avro_framing="registry")
    options = job_options([topic], scope="app", plain=plain)

    stats = run_job(options)

    out, dead = job_output(spark, options, stats)
    assert out == Counter(order_id(n) for n in range(50))
    assert {bytes(r["value"]): r["reason"] for r in dead} == BAD
    assert {r["status"] for r in dead} == {"malformed"}

    # A GuardedConsumer of the scope, reading the same framing with fastavro and keyed by the
    # same rule: copies of what the job wrote are duplicates, the broken records malformed.
    rules = PlainRecords(deserializer=registry_reader, id_rule=id_from_field("orders", "order"),
                         lifetime=Lifetime(ttl_s=600))
    handled, seen = consumer_of_the_scope(
        kafka_bootstrap, redis_url, key_prefix, new_topic,
        [HEADER + order_body(n) for n in [*range(20), *range(50, 60)]] + bad, rules, handles=10)
    assert Counter(handled) == Counter(range(50, 60))
    assert (seen.duplicates, seen.dead_lettered) == (20, 3)


def test_unframed_bodies_once_and_the_broken_ones_dead_lettered(
        spark, new_topic, kafka_bootstrap, job_options, run_job) -> None:
    topic = new_topic(2)
    bodies = [order_body(n) for n in range(-5, 25)]  # negative ids are keys too: "-5"
    produce(kafka_bootstrap, topic, [*bodies[:15], b"\xff" * 3, *bodies[15:]], partition=0)
    produce(kafka_bootstrap, topic, [*bodies[::3], order_body(None)], partition=1)  # copies
    plain = PlainOptions(format="avro", id_namespace="orders", ttl_s=600, id_field="order",
                         avro_schema=json.dumps(ORDER), avro_framing="none")
    options = job_options([topic], scope="app", plain=plain)

    out, dead = job_output(spark, options, run_job(options))
    assert out == Counter(order_id(n) for n in range(-5, 25))
    assert {bytes(r["value"]): r["reason"] for r in dead} == {
        b"\xff" * 3: "plain record: the value is not a valid Avro record of avro_schema",
        order_body(None): "plain record: id field 'order' is missing or null"}
