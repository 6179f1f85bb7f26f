"""Envelope decoding as Spark Columns: marker, fingerprint, from_avro PERMISSIVE, versions,
payload schemas, expiry; and the claim position Spark builds matches eoguard's."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from pyspark.sql import DataFrame, SparkSession

from eoguard.codec import MAGIC, EnvelopeCodec, PayloadCodec, SchemaRegistry, fingerprint_of
from eoguard.codec.schemas import default_schema_dir
from eoguard.envelope import Envelope, now_ms
from eoguard.store.dedup import parse_position, position
from eoguard.store.keys import KeySpace
from eoguard_spark.decode import RowStatus, decode
from eoguard_spark.dedup import position_column, shard_column
from tests.claim_vectors import EDGE_IDS, PARTITION_OFFSETS, READERS, SHARDS, TOPICS, uuid_ids

pytestmark = pytest.mark.spark

ORDER = "eoguard.example.Order"
V0 = Path(__file__).resolve().parents[1] / "data" / "envelope_v0.avsc"
RAW_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
              "timestamp timestamp, timestampType int")


def kafka_rows(spark: SparkSession, values: list[bytes | None]) -> DataFrame:
    """A frame shaped like Spark's Kafka source, one row per value (offsets 0..n-1)."""
    now = dt.datetime.now(dt.timezone.utc)
    return spark.createDataFrame(
        [(b"k", v, "orders", 3, i, now, 0) for i, v in enumerate(values)], RAW_SCHEMA)


def envelope(payload: bytes, *, ttl_ms: int = 600_000, schema: str | None = None) -> Envelope:
    """Created now, or (a negative ``ttl_ms``) a second before it expired ``-ttl_ms`` ago."""
    created = now_ms() + min(0, ttl_ms - 1_000)
    return Envelope.create(payload, ttl_ms=max(ttl_ms, 1_000), producer="decode-test",
                           payload_schema=schema, headers={"trace": "t-1"}, created_at_ms=created)


def order() -> dict[str, Any]:
    return {"order_id": "o-1", "customer": "c-9", "amount": Decimal("12.34"), "currency": "CHF",
            "items": [{"sku": "s", "qty": 2, "unit_price": 1.5}],
            "created_at": dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), "express": True,
            "attributes": {"channel": "web"}, "note": None}


def by_offset(df: DataFrame) -> dict[int, Any]:
    return {row["offset"]: row for row in df.collect()}


def test_envelopes_decode_and_bad_records_get_a_reason(spark: SparkSession) -> None:
    codec = EnvelopeCodec()
    good = envelope(b"hello")
    value = codec.encode(good)
    expired = envelope(b"late", ttl_ms=-1_000)
    unknown_fp = MAGIC + b"\x01" * 8 + value[10:]
    rows = by_offset(decode(kafka_rows(spark, [
        value, codec.encode(expired), b"\x00\x01" + value[2:], value[:6], unknown_fp,
        value[:25], None,
    ]), SchemaRegistry.default()))

    ok = rows[0]
    assert ok["status"] == RowStatus.OK.value
    assert ok["reason"] is None
    assert ok["value"] is None
    assert ok["id"] == good.id
    assert ok["expires_at_ms"] == good.expires_at_ms
    assert bytes(ok["payload"]) == b"hello"
    assert ok["headers"] == {"trace": "t-1"}
    assert (ok["producer"], ok["attempt"], ok["topic"], ok["partition"]) == (
        "decode-test", 1, "orders", 3)

    assert rows[1]["status"] == RowStatus.EXPIRED.value
    assert rows[1]["reason"].startswith("expired at ")
    reasons = {i: rows[i]["reason"] for i in range(2, 7)}
    assert all(rows[i]["status"] == RowStatus.MALFORMED.value for i in range(2, 7))
    assert reasons[2] == "bad magic: starts with 0001, expected c301"
    assert reasons[3] == "bad magic: 6 bytes, shorter than the 10-byte header"
    assert reasons[4] == "unknown fingerprint " + "01" * 8
    assert reasons[5].startswith("corrupt envelope")
    assert reasons[6] == "bad magic: the record has no value"
    assert bytes(rows[5]["value"]) == value[:25]  # the raw record is kept for dead letters


def test_older_envelope_version_is_resolved_to_the_current_one(spark: SparkSession) -> None:
    registry = SchemaRegistry.default()
    v0_schema = json.loads(V0.read_text())
    registry.register(v0_schema, current=False)
    body = io.BytesIO()
    expires = now_ms() + 600_000
    schemaless_writer(body, parse_schema(v0_schema), {
        "id": "01890a5d-ac96-774b-bcce-b302099a8057", "expires_at": expires,
        "created_at": expires - 1000, "producer": "old", "attempt": 2, "payload_schema": None,
        "payload": b"v0"})
    value = MAGIC + fingerprint_of(v0_schema) + body.getvalue()
    row = decode(kafka_rows(spark, [value]), registry).collect()[0]
    assert row["status"] == RowStatus.OK.value, row["reason"]
    assert (row["id"], row["attempt"], bytes(row["payload"])) == (
        "01890a5d-ac96-774b-bcce-b302099a8057", 2, b"v0")
    assert row["headers"] == {}  # the field's default


def test_payload_decodes_into_columns_with_its_schema(spark: SparkSession) -> None:
    codec, payloads = EnvelopeCodec(), PayloadCodec()
    good = envelope(payloads.encode(order(), ORDER), schema=ORDER)
    raw = envelope(b"not an order")
    corrupt = envelope(b"\x02", schema=ORDER)
    rows = by_offset(decode(kafka_rows(spark, [codec.encode(e) for e in (good, raw, corrupt)]),
                            SchemaRegistry.default(), payload_schema=ORDER))
    assert rows[0]["status"] == RowStatus.OK.value, rows[0]["reason"]
    pay = rows[0]["payload"]
    assert (pay["order_id"], pay["amount"], pay["currency"], pay["express"]) == (
        "o-1", Decimal("12.34"), "CHF", True)
    assert pay["items"][0]["qty"] == 2
    assert pay["attributes"] == {"channel": "web"}
    assert rows[1]["status"] == RowStatus.MALFORMED.value
    assert rows[1]["reason"] == f"payload schema null (raw bytes) is not {ORDER}"
    assert rows[2]["status"] == RowStatus.MALFORMED.value
    assert rows[2]["reason"] == f"corrupt payload: not a valid {ORDER}"


@pytest.mark.parametrize("shards", SHARDS)
def test_shard_column_places_ids_as_the_keyspace_does(spark: SparkSession, shards: int) -> None:
    """UUIDs, other ASCII, non-ASCII and characters outside the BMP: Spark's CRC-32 of the
    UTF-8 bytes and ``zlib.crc32`` agree, and so do the two moduli (never negative)."""
    ids = [*uuid_ids(200), *EDGE_IDS]
    df = spark.createDataFrame([(i,) for i in ids], "id string")

    got = {r["id"]: r["shard"] for r in df.select("id", shard_column(shards).alias("shard"))
           .collect()}

    expected = {i: KeySpace(shards=shards).shard_of(i) for i in ids}
    print(f"ids placed={len(got)} shards={shards} used={len(set(got.values()))}")
    assert got == expected
    assert len(set(got.values())) > min(shards - 1, 1)  # not one constant: the check can fail


def test_position_column_spells_eoguards_position(spark: SparkSession) -> None:
    """Length prefixes included, for topics and readers holding '|', ':', digits, non-ASCII
    characters and characters outside the BMP (Spark's length and Python's len agree)."""
    reader = READERS[1]
    topics = TOPICS
    df = spark.createDataFrame([(t, p, o) for t in topics for p, o in PARTITION_OFFSETS],
                               "topic string, partition int, offset long")

    got = {r["position"] for r in df.select(position_column(reader).alias("position")).collect()}

    expected = {position(reader, t, p, o) for t in topics for p, o in PARTITION_OFFSETS}
    print(f"positions checked={len(got)}")
    assert got == expected
    assert len(got) == 10
    assert {parse_position(text) for text in got} == {
        (reader, t, p, o) for t in topics for p, o in PARTITION_OFFSETS}


def generated(df: DataFrame) -> list[tuple[str, int]]:
    """(Java code, largest method in bytes of bytecode) of each whole-stage codegen subtree
    Spark generates for ``df``."""
    jvm: Any = df.sparkSession._jvm
    debug = getattr(jvm.org.apache.spark.sql.execution.debug, "package$").__getattr__("MODULE$")
    subtrees = debug.codegenStringSeq(df._jdf.queryExecution().executedPlan()).iterator()
    out = []
    while subtrees.hasNext():
        subtree = subtrees.next()
        out.append((str(subtree._2()), int(subtree._3().maxMethodCodeSize())))
    assert out, "no whole-stage codegen at all"
    return out


def max_method_bytes(df: DataFrame) -> int:
    """The largest Java method, in bytes of bytecode, of the code Spark generates for ``df``."""
    return max(size for _, size in generated(df))


def test_the_generated_decode_stays_in_methods_the_jvm_compiles(spark: SparkSession) -> None:
    """HotSpot runs a method over 8,000 bytes of bytecode interpreted (DontCompileHugeMethods):
    the whole decode in one method was about 22 KB and ran at half the speed."""
    default = SchemaRegistry.default()
    many = SchemaRegistry.from_dir(default_schema_dir())  # a copy: default() is shared
    for n in range(120):  # 120 payload schemas, checked without a payload_schema
        many.register({"type": "record", "name": f"Load{n}", "namespace": "eoguard.test",
                       "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]})
    raw = kafka_rows(spark, [EnvelopeCodec().encode(envelope(b"x"))])
    sizes = {
        "payload_schema": max_method_bytes(decode(raw, default, payload_schema=ORDER)),
        "raw payloads": max_method_bytes(decode(raw, default)),
        "raw payloads, 120 schemas": max_method_bytes(decode(raw, many)),
    }
    print(f"largest generated method, bytes: {sizes}")
    assert max(sizes.values()) <= 8_000, sizes


def test_only_a_small_stage_of_the_decode_reads_the_clock(spark: SparkSession) -> None:
    """The clock is a long literal in the generated code (in a streaming query: the
    micro-batch's timestamp), so code that reads it is compiled again at every batch. Only
    the stage that computes the status may read it: not the one with the from_avro calls
    below it, nor the one that projects the output rows above it."""
    raw = kafka_rows(spark, [EnvelopeCodec().encode(envelope(b"x"))])
    runs = []
    for _ in range(2):
        df = decode(raw, SchemaRegistry.default(), payload_schema=ORDER)
        runs.append([code for code, _ in generated(df)])
        time.sleep(0.01)  # another current_timestamp()
    changed = [i for i, (one, two) in enumerate(zip(*runs, strict=True)) if one != two]
    print(f"stages={len(runs[0])} code sizes={[len(code) for code in runs[0]]} "
          f"changed with the clock={changed}")
    assert len(runs[0]) == 3, "the decode is not split in three stages"
    assert ["AvroDataToCatalyst" in code for code in runs[0]] == [True, False, False]
    assert changed == [1]  # the clock is in the code: this test can fail
