"""The input rules and payload evolution in the Spark decode: the same verdicts and the same
reasons as a GuardedConsumer (docs/design.md §3)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from eoguard import (
    CodecError,
    CorruptRecordError,
    InputLimits,
    InvalidEnvelopeError,
    SchemaRegistry,
)
from eoguard.codec import EnvelopeCodec, PayloadCodec, check_envelope
from eoguard.envelope import now_ms
from eoguard.stack.feed import envelope
from eoguard_spark.decode import RowStatus, decode
from eoguard_spark.rules import canonical_id
from tests.schema_versions import ORDER, schema_dir
from tests.spark.test_decode import by_offset, kafka_rows
from tests.unit.codec_samples import order
from tests.unit.test_input_rules import ID_VECTORS

pytestmark = pytest.mark.spark

LIMITS = InputLimits(payload_bytes=2_000, header_count=4, header_bytes=200, producer_chars=64,
                     clock_skew_ms=60_000)  # within the test jobs' grace_s
MAX_TTL = 3_600_000


def test_canonical_id_column_agrees_with_python(spark: SparkSession) -> None:
    vectors = [*ID_VECTORS, ("abc\n", None), (str(uuid.uuid4()) + "\n", None)]
    rows = spark.createDataFrame(vectors, "text string, want string").select(
        "text", "want", canonical_id(F.col("text")).alias("got")).collect()
    assert len(rows) == len(vectors)
    assert [(r.text, r.got) for r in rows if r.got != r.want] == []


def test_each_rule_gives_the_consumers_reason(spark: SparkSession) -> None:
    now = now_ms()
    base = envelope()
    bad = [
        dataclasses.replace(base, id=""),
        dataclasses.replace(base, id="7" * 3000),
        dataclasses.replace(base, id="order-17"),
        dataclasses.replace(base, created_at_ms=now, expires_at_ms=now - 1),
        dataclasses.replace(base, expires_at_ms=2**62),
        dataclasses.replace(base, expires_at_ms=now + MAX_TTL + 3_600_000),
        dataclasses.replace(base, attempt=0),
        dataclasses.replace(base, payload=b"p" * 2_001),
        dataclasses.replace(base, producer="q" * 65),
        dataclasses.replace(base, headers={f"h{i}": "v" for i in range(5)}),
        dataclasses.replace(base, headers={"h": "v" * 200}),
    ]
    spelled = str(uuid.uuid4())
    good = [base, dataclasses.replace(base, id="{" + spelled.upper() + "}")]
    codec = EnvelopeCodec()
    not_utf8 = codec.encode(dataclasses.replace(base, producer="PRODUCERX")).replace(
        b"PRODUCERX", b"PRODUCER\xff")
    rows = by_offset(decode(kafka_rows(spark, [codec.encode(e) for e in [*bad, *good]]
                                       + [not_utf8]),
                            SchemaRegistry.default(), max_ttl_ms=MAX_TTL, limits=LIMITS))
    for i, env in enumerate(bad):
        with pytest.raises(InvalidEnvelopeError) as info:
            check_envelope(env, now_ms=now, max_ttl_ms=MAX_TTL, limits=LIMITS)
        row = rows[i]
        assert row["status"] == RowStatus.MALFORMED.value, (i, row["reason"])
        want = str(info.value)
        if info.value.rule == "expiry" and "beyond" in want:  # "now" differs by a few ms
            want = want.split(" (", maxsplit=1)[0]
        assert row["reason"].startswith(want), (i, row["reason"], want)
        assert row["expires_at"] is None
        assert row["value"] is not None
    ok = [rows[len(bad)], rows[len(bad) + 1]]
    corrupt = rows[len(bad) + 2]  # a producer that is not UTF-8: fastavro refuses it too
    assert corrupt["status"] == RowStatus.MALFORMED.value
    assert "is not valid UTF-8" in corrupt["reason"]
    with pytest.raises(CorruptRecordError):
        codec.decode(not_utf8)
    assert [r["status"] for r in ok] == [RowStatus.OK.value] * 2
    assert [r["id"] for r in ok] == [base.id, spelled]  # normalised before any key


def test_headers_that_are_not_utf8_are_corrupt_as_for_fastavro(spark: SparkSession) -> None:
    """The header keys and values are checked joined by an ASCII byte: two keys whose bytes
    would form one valid character across a join without it are still caught."""
    codec = EnvelopeCodec()
    base = envelope()

    def planted(headers: dict[str, str], swaps: dict[bytes, bytes]) -> bytes:
        value = codec.encode(dataclasses.replace(base, headers=headers))
        for placeholder, raw in swaps.items():  # same length: the Avro lengths stay right
            assert len(placeholder) == len(raw)
            assert placeholder in value
            value = value.replace(placeholder, raw)
        return value

    values = {
        "bad value": planted({"trace": "VALUEX"}, {b"VALUEX": b"VALUE\xff"}),
        "bad key": planted({"KEYX": "v"}, {b"KEYX": b"KEY\xfe"}),
        "valid non-ASCII": codec.encode(dataclasses.replace(base, headers={"clé": "übel"})),
    }
    # "K<i>\xc3" then "\xa9L<i>" would read as "K<i>éL<i>" joined without a separator. Spark's
    # map order is a hash order, so several pairs: some come in that order.
    for i in range(8):
        values[f"split character {i}"] = planted(
            {f"K{i}X": "1", f"XL{i}": "2"}, {b"K%dX" % i: b"K%d\xc3" % i, b"XL%d" % i: b"\xa9L%d" % i})
    decoded = decode(kafka_rows(spark, list(values.values())), SchemaRegistry.default(),
                     max_ttl_ms=MAX_TTL, limits=LIMITS)
    rows = by_offset(decoded.withColumn(  # what a join without a separator would say
        "joined_valid", F.is_valid_utf8(F.concat_ws("", F.map_keys("headers")))))
    want = {}
    for name, value in values.items():
        try:
            codec.decode(value)
            want[name] = RowStatus.OK.value
        except CorruptRecordError:
            want[name] = RowStatus.MALFORMED.value
    assert [n for n, status in want.items() if status == "ok"] == ["valid non-ASCII"]
    assert {name: rows[i]["status"] for i, name in enumerate(values)} == want
    assert all("is not valid UTF-8" in rows[i]["reason"]
               for i, name in enumerate(values) if want[name] == "malformed")
    assert any(rows[i]["joined_valid"] for i, name in enumerate(values)
               if name.startswith("split")), "no pair came in the order that tests the join"


@pytest.mark.parametrize("reader", ["older", "newer"])
def test_orders_of_both_versions_decode_into_the_readers(spark: SparkSession, tmp_path: Path,
                                                         reader: str) -> None:
    registries = {v: SchemaRegistry.from_dir(schema_dir(tmp_path, v)) for v in ("older", "newer")}
    newer_order = {k: v for k, v in order(gift_wrap=True).items() if k != "note"}
    values = []
    for version, value in (("older", order()), ("newer", newer_order)):
        payloads = PayloadCodec(registries[version])
        env = dataclasses.replace(envelope(payload_schema=ORDER),
                                  payload=payloads.encode(value, ORDER),
                                  payload_fingerprint=payloads.writer_fingerprint(ORDER))
        values.append(EnvelopeCodec(registries[version]).encode(env))
    alien = dataclasses.replace(envelope(payload_schema=ORDER), payload=b"\x00",
                                payload_fingerprint=b"\x01" * 8)
    values.append(EnvelopeCodec().encode(alien))
    rows = by_offset(decode(kafka_rows(spark, values), registries[reader], payload_schema=ORDER))
    assert [rows[i]["status"] for i in range(3)] == ["ok", "ok", "malformed"]
    got = [rows[i]["payload"].asDict(recursive=True) for i in range(2)]
    fields = set(got[0])
    if reader == "older":
        assert "note" in fields
        assert "gift_wrap" not in fields
        assert [g["note"] for g in got] == [order()["note"], None]
    else:
        assert "gift_wrap" in fields
        assert "note" not in fields
        assert [g["gift_wrap"] for g in got] == [False, True]
    assert [g["order_id"] for g in got] == [order()["order_id"]] * 2
    assert rows[2]["reason"].startswith("payload writer schema 0101010101010101")


@pytest.mark.integration
def test_the_job_dead_letters_bad_input_and_writes_no_key_for_it(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client, key_prefix
        ) -> None:
    from eoguard.stack.feed import produce  # noqa: PLC0415

    topic = new_topic(2)
    now = now_ms()
    base = envelope()
    bad = [dataclasses.replace(base, id=""), dataclasses.replace(base, id="order-17"),
           dataclasses.replace(base, id=str(uuid.uuid4()), expires_at_ms=2**62),
           dataclasses.replace(base, id=str(uuid.uuid4()), created_at_ms=now,
                               expires_at_ms=now - 1),
           dataclasses.replace(base, id=str(uuid.uuid4()), payload=b"p" * 2_001)]
    good = [envelope() for _ in range(6)]
    spelled = str(uuid.uuid4())
    copies = [dataclasses.replace(base, id="{" + spelled.upper() + "}"),
              dataclasses.replace(base, id=spelled), dataclasses.replace(good[0], id=good[0].id.upper())]
    codec = EnvelopeCodec()
    produce(kafka_bootstrap, topic, [codec.encode(e) for e in [*bad, *good, *copies]])
    options = job_options([topic], input_limits=LIMITS)
    run_job(options)
    out = [r["id"] for r in spark.read.parquet(options.output_path).select("id").collect()]
    assert sorted(out) == sorted([e.id for e in good] + [spelled])
    dead = spark.read.parquet(options.dead_letter_path).collect()
    assert sorted(r["status"] for r in dead) == ["malformed"] * len(bad)
    reasons = " | ".join(sorted(r["reason"] for r in dead))
    for words in ("'' (0 characters) is not a UUID", "'order-17' (8 characters) is not a UUID",
                  "is beyond now + max_ttl", "is before created_at", "payload is 2001 bytes"):
        assert words in reasons, (words, reasons)
    keyed = [k.decode().rsplit(":", 1)[1] for k in redis_client.scan_iter(f"{key_prefix}:dc:*")]
    assert sorted(keyed) == sorted([e.id for e in good] + [spelled])


def test_without_a_payload_schema_named_payloads_are_still_checked_as_the_consumer_does(
        spark: SparkSession) -> None:
    # The job keeps payloads raw without --payload-schema, yet refuses what a GuardedConsumer
    # refuses: an unknown schema name, an unknown writer version, a body not of its schema.
    base = envelope()
    payloads = PayloadCodec()
    fine = dataclasses.replace(base, payload_schema=ORDER, payload=payloads.encode(order(), ORDER),
                               payload_fingerprint=payloads.writer_fingerprint(ORDER))
    cases = [
        dataclasses.replace(base, payload_schema="no.such.Schema"),
        dataclasses.replace(fine, payload_fingerprint=b"\x07" * 8),
        dataclasses.replace(fine, payload=b""),
        dataclasses.replace(fine, payload=b"\x02"),
    ]
    codec = EnvelopeCodec()
    rows = by_offset(decode(kafka_rows(spark, [codec.encode(e) for e in [*cases, fine, base]]),
                            SchemaRegistry.default(), max_ttl_ms=MAX_TTL, limits=LIMITS))
    for i, env in enumerate(cases):
        with pytest.raises(CodecError) as info:
            payloads.decode_envelope(env)
        assert rows[i]["status"] == RowStatus.MALFORMED.value, (i, rows[i]["reason"])
        assert str(info.value).startswith(rows[i]["reason"]), (i, rows[i]["reason"], str(info.value))
    assert [rows[4]["status"], rows[5]["status"]] == [RowStatus.OK.value] * 2
    assert rows[4]["payload"] == fine.payload  # still the raw bytes
