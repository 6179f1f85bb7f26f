"""Records in the header wire format at the Spark decode (eoguard_spark.header_format): the
verdicts and reasons a GuardedConsumer gives (eoguard.codec.headers), payloads read by writer
schema id, and a schema id new to the query stopping the batch, naming the id. The writer
schemas come from a plan built by hand (the registry's part is tests/spark/test_job_headers.py)."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from typing import Any

import pytest
from fastavro import schemaless_writer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from eoguard import InputLimits, InvalidEnvelopeError, SchemaRegistry
from eoguard.codec import EnvelopeCodec, check_envelope
from eoguard.codec.headers import (
    ATTEMPT,
    CONTENT_TYPE,
    EXPIRY_TIME,
    ID,
    PRODUCER,
    SPEC_VERSION,
    TIME,
    format_time,
    header_envelope,
    parse_time,
    read_headers,
    write_headers,
)
from eoguard.codec.registry_payloads import frame
from eoguard.envelope import now_ms
from eoguard.stack.feed import envelope
from eoguard_spark.decode import RowStatus
from eoguard_spark.header_format import NEW_SCHEMA_ID, HeaderPlan, _epoch_ms, new_schema_ids
from eoguard_spark.plain import decode_topic
from tests.schema_versions import ORDER, order_schema
from tests.spark.test_decode import order

pytestmark = pytest.mark.spark

HEADERS_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                  "timestamp timestamp, timestampType int, "
                  "headers array<struct<key:string,value:binary>>")
LIMITS = InputLimits(clock_skew_ms=60_000)
MAX_TTL = 3_600_000
ORDER_ID, REFUSED_ID, NEW_ID = 7, 9, 11
RECURSIVE_ID = 13  # a schema fastavro reads and Spark's from_avro cannot convert
RECURSIVE = {"type": "record", "name": "Node", "namespace": "shop",
             "fields": [{"name": "next", "type": ["null", "Node"], "default": None}]}
PLAN = HeaderPlan(writers={ORDER_ID: json.dumps(order_schema("older")),
                           RECURSIVE_ID: json.dumps(RECURSIVE)},
                  refused={REFUSED_ID: f"schema id {REFUSED_ID} is not in Schema Registry"})

Headers = list[tuple[str, bytes | None]]


def headers(*, schema: str | None = ORDER, ttl_ms: int = 600_000, mid: str | None = None,
            app: dict[str, str] | None = None) -> Headers:
    created = now_ms() - 1_000
    return [(k, v.encode()) for k, v in write_headers(
        mid or str(uuid.uuid4()), created, created + ttl_ms, attempt=1, producer="p-1",
        source="/test", schema=schema, app=app).items()]


def replaced(name: str, value: bytes | None) -> Headers:
    return [(k, value if k == name else v) for k, v in headers()]


def without(name: str) -> Headers:
    return [(k, v) for k, v in headers() if k != name]


def body() -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, SchemaRegistry.default().get(ORDER).parsed, order())
    return out.getvalue()


def rows(spark: SparkSession, records: list[tuple[bytes | None, Headers | None]]) -> DataFrame:
    now = dt.datetime.now(dt.timezone.utc)
    return spark.createDataFrame(
        [(b"k", value, "orders", 3, i, now, 0, heads) for i, (value, heads) in enumerate(records)],
        HEADERS_SCHEMA)


def decoded(spark: SparkSession, records: list[tuple[bytes | None, Headers | None]],
            payload_schema: str | None = None) -> dict[int, Any]:
    frame_ = decode_topic(rows(spark, records), SchemaRegistry.default(), max_ttl_ms=MAX_TTL,
                          limits=LIMITS, payload_schema=payload_schema, header_plan=PLAN)
    return {row["offset"]: row for row in frame_.collect()}


def consumer_reason(heads: Headers, value: bytes | None) -> str | None:
    """What a GuardedConsumer says of the record's headers and input rules (None: nothing)."""
    try:
        fields = read_headers(heads)
        assert fields is not None
        check_envelope(header_envelope(fields, value), now_ms=now_ms(), max_ttl_ms=MAX_TTL,
                       limits=LIMITS)
    except InvalidEnvelopeError as exc:
        return str(exc)
    return None


BROKEN: list[Headers] = [
    without(ID), without(TIME), without(EXPIRY_TIME), without(PRODUCER), without(SPEC_VERSION),
    without(CONTENT_TYPE), [(ATTEMPT, b"1")],
    replaced(SPEC_VERSION, b"0.3"), replaced(ATTEMPT, b"0"), replaced(ATTEMPT, b"2147483648"),
    replaced(ATTEMPT, b"x" * 80), replaced(TIME, b"1800000000123"),
    replaced(EXPIRY_TIME, b"2027-02-29T00:00:00Z"), replaced(TIME, b"0000-01-01T00:00:00Z"),
    replaced(EXPIRY_TIME, b"2027-01-15T08:00:00+24:00"), replaced(ID, None),
    replaced(PRODUCER, b"\xff\xfe"), [*headers(), ("CE_ID", str(uuid.uuid4()).encode())],
    replaced(ID, b"order-17"),
    replaced(EXPIRY_TIME, format_time(now_ms() - 5_000).encode()),  # before ce_time
    replaced(EXPIRY_TIME, format_time(now_ms() + MAX_TTL + 3_600_000).encode()),
]


def test_each_missing_or_malformed_header_gives_the_consumers_reason(spark: SparkSession) -> None:
    value = frame(ORDER_ID, body())
    got = decoded(spark, [(value, heads) for heads in BROKEN])
    assert len(got) == len(BROKEN)
    for i, heads in enumerate(BROKEN):
        want = consumer_reason(heads, value)
        assert want is not None, i
        if "beyond" in want:  # "now" differs by a few ms
            want = want.split(" (", maxsplit=1)[0]
        assert got[i]["status"] == RowStatus.MALFORMED.value, (i, got[i]["reason"])
        assert got[i]["reason"].startswith(want), (i, got[i]["reason"], want)


TIMES = [
    "2027-01-15T08:00:00.123Z", "2027-01-15t10:30:00.123456+02:30", "2027-01-15T07:00:00.1-01:00",
    "2024-02-29T23:59:60Z", "1970-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z",
    "2000-03-01T00:00:00.000Z", "2100-02-28T12:00:00Z", "0001-01-01T00:00:00Z",
    "1969-12-31T23:59:59.999Z", "2100-02-29T00:00:00Z", "2000-02-29T00:00:00Z",
    "2027-01-15T08:00:00", "2027-01-15 08:00:00Z", "0000-01-01T00:00:00Z", "2027-04-31T00:00:00Z",
    "2027-01-15T08:00:00+23:59", "2027-01-15T08:00:00-00:60", "2027-01-15T08:00:00.Z", "",
]


def test_times_read_as_the_consumer_reads_them(spark: SparkSession) -> None:
    frame_ = spark.createDataFrame([(t,) for t in TIMES], "text string")
    got = {r["text"]: r["ms"] for r in frame_.select(
        "text", _epoch_ms(F.col("text"))[0].alias("ms")).collect()}
    want = {}
    for text in TIMES:
        try:
            want[text] = parse_time(text)
        except ValueError:
            want[text] = None
    assert got == want


def test_good_records_decode_by_writer_id_beside_envelopes(spark: SparkSession) -> None:
    mid = str(uuid.uuid4())
    value = frame(ORDER_ID, body())
    env = envelope(b"raw")
    records: list[tuple[bytes | None, Headers | None]] = [
        (value, headers(mid=mid.upper(), app={"trace": "t-1"})),
        (b'{"order": 1}', headers(schema=None, app={"content-type": "application/json"})),
        (EnvelopeCodec().encode(env), None),
        (value, headers(ttl_ms=500)),  # created a second ago: expired
    ]
    got = decoded(spark, records)
    assert got[0]["status"] == RowStatus.OK.value, got[0]["reason"]
    assert got[0]["id"] == mid
    assert got[0]["payload"] == value  # no payload_schema: the value as it is
    assert got[0]["attempt"] == 1
    assert got[0]["producer"] == "p-1"
    assert got[0]["headers"] == {"ce_source": "/test", "ce_type": ORDER, "trace": "t-1"}
    assert got[1]["status"] == RowStatus.OK.value, got[1]["reason"]
    assert got[1]["payload"] == b'{"order": 1}'
    assert got[2]["status"] == RowStatus.OK.value
    assert got[2]["id"] == env.id
    assert got[3]["status"] == RowStatus.EXPIRED.value
    typed = decoded(spark, records[:1], payload_schema=ORDER)
    assert typed[0]["payload"]["order_id"] == order()["order_id"]
    raw_too = decoded(spark, records[1:2], payload_schema=ORDER)
    assert raw_too[0]["reason"] == f"payload schema null (raw bytes) is not {ORDER}"


def test_a_bad_prefix_a_refused_id_and_a_corrupt_body_are_malformed(spark: SparkSession) -> None:
    records: list[tuple[bytes | None, Headers | None]] = [
        (b'{"order": 1}', headers()),
        (b"\x00\x00\x00\x00\x07", headers()),
        (None, headers()),
        (frame(REFUSED_ID, body()), headers()),
        (frame(ORDER_ID, b"\x02\xff\xff\xff\xff\xff"), headers()),
        (frame(RECURSIVE_ID, b"\x00"), headers()),
    ]
    got = decoded(spark, records)
    assert [got[i]["reason"] for i in range(len(records))] == [
        "not a Schema Registry framed value: starts with 7b, expected 00",
        "not a Schema Registry framed value: 5 bytes, need more than 5",
        "not a Schema Registry framed value: no value, need more than 5",
        f"schema id {REFUSED_ID} is not in Schema Registry",
        f"payload is not a valid {ORDER} record",
        f"schema id {RECURSIVE_ID} (shop.Node) cannot be read by Spark's from_avro",
    ]


def test_a_schema_id_new_to_the_query_stops_the_batch_naming_it(spark: SparkSession) -> None:
    records: list[tuple[bytes | None, Headers | None]] = [
        (frame(ORDER_ID, body()), headers()), (frame(NEW_ID, body()), headers())]
    with pytest.raises(Exception, match=NEW_SCHEMA_ID) as caught:
        decoded(spark, records)
    assert new_schema_ids(caught.value) == (NEW_ID,)
