"""Spark reads eoguard's envelopes: ``format("kafka")``, drop the 10-byte header, ``from_avro``."""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

from eoguard import Envelope, EnvelopeCodec, PayloadCodec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
ORDER = "eoguard.example.Order"


def test_spark_decodes_envelopes_with_from_avro(spark: SparkSession, kafka_bootstrap: str,
                                                new_topic: Callable[..., str]) -> None:
    from pyspark.sql.avro.functions import from_avro  # noqa: PLC0415 - Spark tests only
    from pyspark.sql.functions import col, expr  # noqa: PLC0415

    topic = new_topic(partitions=2)
    codec, payloads = EnvelopeCodec(), PayloadCodec()
    sent = []
    for i in range(20):
        payload = payloads.encode({
            "order_id": f"o-{i}", "customer": "c", "amount": decimal.Decimal(i),
            "currency": "EUR", "items": [], "created_at": 1_700_000_000_000 + i,
        }, ORDER) if i % 2 else f"raw-{i}".encode()
        sent.append(Envelope.create(payload, ttl_ms=3_600_000, producer="spark-smoke",
                                    payload_schema=ORDER if i % 2 else None,
                                    headers={"i": str(i)}))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for i, env in enumerate(sent):
        producer.produce(topic, key=str(i).encode(), value=codec.encode(env))
    assert producer.flush(30) == 0

    envelope_json = (ROOT / "schemas" / "envelope.avsc").read_text()
    assert json.loads(envelope_json) == codec.schema_json
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .select(from_avro(expr("substring(value, 11, length(value) - 10)"), envelope_json)
                .alias("env"))
        .select(
            col("env.id").alias("id"),
            expr("unix_millis(env.expires_at)").alias("expires_at_ms"),
            expr("unix_millis(env.created_at)").alias("created_at_ms"),
            col("env.producer").alias("producer"),
            col("env.attempt").alias("attempt"),
            col("env.payload_schema").alias("payload_schema"),
            col("env.payload").alias("payload"),
            col("env.headers").alias("headers"),
        )
        .collect()
    )

    decoded = {
        row["id"]: Envelope(
            id=row["id"], expires_at_ms=row["expires_at_ms"], created_at_ms=row["created_at_ms"],
            producer=row["producer"], attempt=row["attempt"],
            payload_schema=row["payload_schema"], payload=bytes(row["payload"]),
            headers=dict(row["headers"]),
        )
        for row in rows
    }
    assert len(rows) == len(sent)
    assert decoded == {env.id: env for env in sent}
