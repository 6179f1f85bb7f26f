"""Plain records in the Spark decode: the ids the consumer computes (tests/plain_vectors.py),
envelopes and plain records told apart by the consumer's check, and a broken rule's reason."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from eoguard.codec import EnvelopeCodec, SchemaRegistry
from eoguard.envelope import message_id_for
from eoguard.store.keys import KeySpace
from eoguard_spark import PlainOptions
from eoguard_spark.decode import RowStatus
from eoguard_spark.dedup import shard_column
from eoguard_spark.plain import decode_topic
from tests.plain_vectors import HEADER_KEYS, INT_KEYS, NAMESPACE, TEXT_KEYS
from tests.spark.test_decode import envelope

pytestmark = pytest.mark.spark

SOURCE = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>")


def source_rows(spark: SparkSession, records: list[tuple[bytes | None, list[tuple[str, Any]]]],
                *, age_s: float = 0) -> DataFrame:
    """A frame shaped like Spark's Kafka source with headers, one row per (value, headers)."""
    at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=age_s)
    return spark.createDataFrame(
        [(b"k", v, "orders", 0, i, at, 0, h) for i, (v, h) in enumerate(records)], SOURCE)


def decoded(spark: SparkSession, records: list[tuple[bytes | None, list[tuple[str, Any]]]],
            plain: PlainOptions, **kwargs: Any) -> dict[int, Any]:
    frame = decode_topic(source_rows(spark, records, **kwargs), SchemaRegistry.default(),
                         plain=plain)
    return {r["offset"]: r for r in frame.withColumn("shard", shard_column(16)).collect()}


def test_plain_ids_and_shards_are_the_consumers(spark: SparkSession) -> None:
    keys: list[Any] = [*TEXT_KEYS, *INT_KEYS]
    by_field = PlainOptions(format="json", id_namespace=NAMESPACE, ttl_s=600,
                            id_field="order_id")
    rows = decoded(spark, [(json.dumps({"order_id": k}).encode(), []) for k in keys], by_field)
    by_header = PlainOptions(format="raw", id_namespace=NAMESPACE, ttl_s=600,
                             id_header="order-id")
    headers = list(HEADER_KEYS)
    # other headers around it, and an earlier value of the same name: the last one counts
    header_rows = decoded(spark, [(b"\x00raw", [("order-id", b"old"), ("x", None),
                                                ("order-id", k), ("y", b"1")])
                                  for k in headers], by_header)

    want = [*TEXT_KEYS.values(), *INT_KEYS.values()]
    got = [rows[i]["id"] for i in range(len(keys))]
    print(f"field ids={len(got)} header ids={len(header_rows)}")
    assert got == want
    assert [header_rows[i]["id"] for i in range(len(headers))] == list(HEADER_KEYS.values())
    for row in [*rows.values(), *header_rows.values()]:
        assert row["status"] == RowStatus.OK.value, row["reason"]
        assert row["shard"] == KeySpace(shards=16).shard_of(row["id"])


def test_a_mixed_topic_and_each_broken_rule_with_its_reason(spark: SparkSession) -> None:
    plain = PlainOptions(format="json", id_namespace=NAMESPACE, ttl_s=600, id_field="order",
                         json_schema="order bigint, total_cents bigint")
    env = envelope(b'{"order": 1}')
    records: list[tuple[bytes | None, list[tuple[str, Any]]]] = [
        (EnvelopeCodec().encode(env), []),  # 0: an envelope
        (b'{"order": 7, "total_cents": 700}', []),  # 1: a plain record
        (b'{"order": 7', []),  # 2: not JSON
        (b'{"total_cents": 1}', []),  # 3: no id field
        (b'{"order": 4.0}', []),  # 4: a float: not of json_schema
        (b'{"order": true}', []),  # 5: nor a bool
        (b'{"order": 8, "total_cents": "many"}', []),  # 6: not of json_schema
        (None, []),  # 7: a tombstone
        (b"\xff\xfe", []),  # 8: not UTF-8
    ]
    rows = decoded(spark, records, plain)

    for offset in sorted(rows):
        print(offset, rows[offset]["status"], rows[offset]["reason"])
    assert rows[0]["status"] == RowStatus.OK.value
    assert rows[0]["id"] == env.id
    assert rows[0]["producer"] == env.producer
    ok = rows[1]
    assert (ok["status"], ok["reason"]) == (RowStatus.OK.value, None)
    assert ok["id"] == message_id_for(NAMESPACE, "7")
    assert bytes(ok["payload"]) == records[1][0]
    assert (ok["producer"], ok["attempt"], ok["value"]) == ("", 1, None)
    assert ok["expires_at_ms"] == int(ok["kafka_timestamp"].timestamp() * 1000) + 600_000
    reasons = {offset: rows[offset]["reason"] for offset in range(2, 9)}
    assert {rows[o]["status"] for o in reasons} == {RowStatus.MALFORMED.value}
    assert reasons == {
        2: "plain record: the value is not valid JSON of json_schema",
        3: "plain record: id field 'order' is missing or null",
        4: "plain record: the value is not valid JSON of json_schema",
        5: "plain record: the value is not valid JSON of json_schema",
        6: "plain record: the value is not valid JSON of json_schema",
        7: "plain record: the value is not valid JSON of json_schema",
        8: "plain record: the value is not valid JSON of json_schema",
    }
    assert all(rows[o]["value"] == records[o][0] for o in reasons)


def test_without_a_schema_a_float_or_bool_is_no_key_and_an_old_record_expires(
        spark: SparkSession) -> None:
    plain = PlainOptions(format="json", id_namespace=NAMESPACE, ttl_s=60, id_field="order")
    rows = decoded(spark, [(b'{"order": 1}', []), (b'{"order": 4.0}', []),
                           (b'{"order": true}', []), (b'{"order": "x"}', [])], plain, age_s=120)

    assert rows[0]["status"] == RowStatus.EXPIRED.value
    assert rows[0]["reason"].startswith("expired at ")
    assert rows[1]["reason"] == "plain record: id field 'order' is decimal(1,0), not text or an integer"
    assert rows[2]["reason"] == "plain record: id field 'order' is boolean, not text or an integer"
    assert rows[3]["status"] == RowStatus.EXPIRED.value
