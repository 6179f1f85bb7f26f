"""Plain Avro records in the Spark decode: the ids a consumer computes with fastavro
(tests/plain_vectors.py) in both framings, each broken rule's reason, mutated bodies read
alike by both, and a schema Spark cannot read refused before the query runs."""

from __future__ import annotations

import datetime as dt
import io
import json
import random
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pyspark.sql import SparkSession

from eoguard.codec import InputLimits, SchemaRegistry
from eoguard.codec.plain import Lifetime, PlainRecords, id_from_field, read_plain
from eoguard.envelope import message_id_for
from eoguard.errors import ConfigError, InvalidRecordError
from eoguard_spark import PlainOptions
from eoguard_spark.decode import RowStatus
from eoguard_spark.plain import decode_topic
from tests.plain_vectors import (
    AVRO_BODIES,
    AVRO_CONSUMER_ONLY,
    AVRO_REFUSED,
    INT_KEYS,
    NAMESPACE,
    TEXT_KEYS,
    avro_order_schema,
)
from tests.spark.test_plain import decoded, source_rows

pytestmark = pytest.mark.spark

REGISTRY_HEADER = b"\x00" + (17).to_bytes(4, "big")  # magic 0, schema id 17 (not looked up)


def options(id_type: str, framing: str = "none", **overrides: Any) -> PlainOptions:
    values: dict[str, Any] = {
        "format": "avro", "id_namespace": NAMESPACE, "ttl_s": 600, "id_field": "order_id",
        "avro_schema": json.dumps(avro_order_schema(id_type)), "avro_framing": framing}
    values.update(overrides)
    return PlainOptions(**values)


def body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return out.getvalue()


def test_avro_ids_are_the_consumers_in_both_framings(spark: SparkSession) -> None:
    cases: dict[str, list[tuple[bytes, str | None]]] = {}  # id type -> (body, id or None)
    for (id_type, hex_body), mid in AVRO_BODIES.items():
        cases.setdefault(id_type, []).append((bytes.fromhex(hex_body), mid))
    for (id_type, hex_body) in [*AVRO_REFUSED, *AVRO_CONSUMER_ONLY]:
        cases.setdefault(id_type, []).append((bytes.fromhex(hex_body), None))
    for text, mid in TEXT_KEYS.items():
        cases["string"].append((body(avro_order_schema("string"),
                                     {"order_id": text, "note": "n"}), mid))
    for number, mid in INT_KEYS.items():
        cases["long"].append((body(avro_order_schema("long"),
                                   {"order_id": number, "note": None}), mid))
    checked = 0
    for id_type, bodies in cases.items():
        for framing, head in (("none", b""), ("registry", REGISTRY_HEADER)):
            rows = decoded(spark, [(head + b, []) for b, _ in bodies], options(id_type, framing))
            for offset, (raw, want) in enumerate(bodies):
                row = rows[offset]
                if want is None:
                    assert row["status"] == RowStatus.MALFORMED.value, (id_type, raw.hex())
                    assert row["id"] is None
                else:
                    assert (row["status"], row["reason"]) == (RowStatus.OK.value, None), raw.hex()
                    assert row["id"] == want, (id_type, framing, raw.hex())
                    assert bytes(row["payload"]) == head + raw  # the raw value, framing and all
                checked += 1
    for (id_type, hex_body), reason in AVRO_REFUSED.items():
        rows = decoded(spark, [(bytes.fromhex(hex_body), [])], options(id_type))
        assert rows[0]["reason"] == reason, hex_body
    for (id_type, hex_body) in AVRO_CONSUMER_ONLY:
        rows = decoded(spark, [(bytes.fromhex(hex_body), [])], options(id_type))
        assert rows[0]["reason"] == ("plain record: the value is not a valid Avro record of "
                                     "avro_schema")
    print(f"avro rows checked={checked}")


def test_each_broken_rule_has_its_reason_and_the_rows_around_it_pass(
        spark: SparkSession) -> None:
    schema = avro_order_schema("null|long")
    good = body(schema, {"order_id": 7, "note": "a note"})
    no_id_field = body({"type": "record", "name": "Old", "fields": [
        {"name": "total_cents", "type": "long"}]}, {"total_cents": -1})
    records: list[tuple[bytes | None, list[tuple[str, Any]]]] = [
        (REGISTRY_HEADER + good, []),  # 0: ok
        (b"\x01" + REGISTRY_HEADER[1:] + good, []),  # 1: wrong magic byte
        (REGISTRY_HEADER, []),  # 2: the header alone
        (None, []),  # 3: a tombstone
        (REGISTRY_HEADER + good[:-2], []),  # 4: truncated body
        (REGISTRY_HEADER + body(schema, {"order_id": None, "note": "x"}), []),  # 5: null id
        (REGISTRY_HEADER + no_id_field, []),  # 6: written by a schema without the id field
        (good, []),  # 7: the body alone (union branch 1: 02) where the framing is expected
        (REGISTRY_HEADER + body(schema, {"order_id": 8, "note": "y"}), []),  # 8: ok
        (REGISTRY_HEADER + good + b"x" * 64, []),  # 9: over the size limit
    ]
    frame = decode_topic(source_rows(spark, records), SchemaRegistry.default(),
                         plain=options("null|long", "registry"),
                         limits=InputLimits(payload_bytes=40))
    rows = {r["offset"]: r for r in frame.collect()}

    for offset in sorted(rows):
        print(offset, rows[offset]["status"], rows[offset]["reason"])
    assert rows[0]["id"] == message_id_for(NAMESPACE, "7")
    assert rows[8]["id"] == message_id_for(NAMESPACE, "8")
    assert {rows[o]["status"] for o in (0, 8)} == {RowStatus.OK.value}
    assert {o: rows[o]["reason"] for o in range(1, 8)} | {9: rows[9]["reason"]} == {
        1: "plain record: bad magic: starts with 01, expected 00 (Schema Registry framing)",
        2: "plain record: 5 bytes, too short for the 5-byte Schema Registry header and a body",
        3: "plain record: the record has no value",
        4: "plain record: the value is not a valid Avro record of avro_schema",
        5: "plain record: id field 'order_id' is missing or null",
        6: "plain record: the value is not a valid Avro record of avro_schema",
        7: "plain record: bad magic: starts with 02, expected 00 (Schema Registry framing)",
        9: f"plain record: value is {len(REGISTRY_HEADER + good) + 64} bytes, over 40",
    }
    assert all(rows[o]["status"] == RowStatus.MALFORMED.value for o in (*range(1, 8), 9))
    assert all(rows[o]["value"] == records[o][0] for o in (*range(1, 8), 9))


def test_an_id_from_a_header_still_needs_a_valid_avro_body(spark: SparkSession) -> None:
    plain = options("string", "registry", id_field=None, id_header="order-id")
    good = REGISTRY_HEADER + body(avro_order_schema("string"), {"order_id": "x", "note": None})
    rows = decoded(spark, [(good, [("order-id", b"o-1")]),
                           (REGISTRY_HEADER + b"\x07", [("order-id", b"o-2")]),
                           (good, [])], plain)

    assert (rows[0]["status"], rows[0]["id"]) == (RowStatus.OK.value, TEXT_KEYS["o-1"])
    assert rows[1]["reason"] == "plain record: the value is not a valid Avro record of avro_schema"
    assert rows[2]["reason"] == "plain record: no header 'order-id' (the id's key)"


FUZZ_SCHEMA_FIELDS = [
    {"name": "note", "type": ["null", "string"]}, {"name": "n", "type": "int"},
    {"name": "ok", "type": "boolean"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "blob", "type": "bytes"},
    {"name": "extra", "type": {"type": "map", "values": {"type": "record", "name": "Extra",
                                                         "fields": [{"name": "b", "type": "bytes"},
                                                                    {"name": "s", "type": "string"}]}}},
]


def mutations(goods: list[bytes], rng: random.Random, count: int) -> list[bytes]:
    """Valid bodies with a bit flipped, cut short or a byte inserted, and random bytes."""
    out = []
    for _ in range(count):
        value = bytearray(rng.choice(goods))
        at = rng.randrange(len(value) + 1)
        match rng.randrange(4):
            case 0:
                value[min(at, len(value) - 1)] ^= 1 << rng.randrange(8)
            case 1:
                del value[at:]
            case 2:
                value[at:at] = bytes([rng.randrange(256)])
            case _:
                value = bytearray(rng.randbytes(rng.randrange(1, 16)))
        out.append(bytes(value))
    return out


@pytest.mark.parametrize("id_type", ["string", "long", "null|int"])
def test_mutated_bodies_are_read_alike_by_the_consumer_and_the_job(
        spark: SparkSession, id_type: str) -> None:
    kind: Any = id_type.split("|") if "|" in id_type else id_type
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "order_id", "type": kind}, *FUZZ_SCHEMA_FIELDS]}
    keys: list[Any] = ["o-1", "\u00fc", ""] if id_type == "string" else [0, 42, -7, 2**31 - 1]
    goods = [body(schema, {"order_id": k, "note": "x", "n": 3, "ok": True, "kind": "B",
                           "tags": ["a", "bc"], "blob": b"\xff", "extra": {"k": {"b": b"\xfe",
                                                                               "s": "v"}}})
             for k in keys]
    values = goods + mutations(goods, random.Random(id_type), 400)
    parsed = parse_schema(schema)
    rules = PlainRecords(deserializer=lambda raw: schemaless_reader(io.BytesIO(raw), parsed),
                         id_rule=id_from_field(NAMESPACE, "order_id"), lifetime=Lifetime(ttl_s=600))
    plain = PlainOptions(format="avro", id_namespace=NAMESPACE, ttl_s=600, id_field="order_id",
                         avro_schema=json.dumps(schema), avro_framing="none")
    now_ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)

    rows = decoded(spark, [(v, []) for v in values], plain)

    both = consumer_only = 0
    for offset, value in enumerate(values):
        try:
            envelope, _ = read_plain(rules, value, key=None, headers=None, timestamp_ms=now_ms,
                                     topic="t", partition=0, offset=0, now_ms=now_ms,
                                     max_ttl_ms=86_400_000, limits=InputLimits())
            consumer: str | None = envelope.id
        except InvalidRecordError:
            consumer = None
        row = rows[offset]
        job = row["id"] if row["status"] == RowStatus.OK.value else None
        if job is not None:  # what the job handles, the consumer handles under the same id
            assert job == consumer, value.hex()
            both += 1
        elif consumer is not None:  # fastavro's leniencies (AVRO_CONSUMER_ONLY)
            assert row["reason"] == ("plain record: the value is not a valid Avro record of "
                                     "avro_schema"), value.hex()
            consumer_only += 1
    print(f"{id_type}: bodies={len(values)} both={both} consumer only={consumer_only}")
    assert both >= len(goods)


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "record", "name": "not-a-name", "fields": [{"name": "order_id", "type": "string"}]},
     "Illegal character in: not-a-name"),
    ({"type": "record", "name": "Node", "fields": [{"name": "order_id", "type": "string"},
                                                   {"name": "next", "type": ["null", "Node"]}]},
     "Found recursive reference"),
])
def test_a_schema_fastavro_takes_and_spark_cannot_read_is_refused(
        spark: SparkSession, schema: dict[str, Any], words: str) -> None:
    plain = PlainOptions(format="avro", id_namespace=NAMESPACE, ttl_s=600, id_field="order_id",
                         avro_schema=json.dumps(schema), avro_framing="none")
    with pytest.raises(ConfigError, match="cannot be read by Spark's from_avro") as refused:
        decode_topic(source_rows(spark, [(b"\x00", [])]), SchemaRegistry.default(), plain=plain)
    assert words in str(refused.value)
