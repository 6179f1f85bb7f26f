"""Plain records (codec/plain.py): the configuration's checks, which records are envelopes,
and what each rule's failure or nonsense becomes (InvalidRecordError naming the rule)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from eoguard import (
    ConfigError,
    ConsumerConfig,
    InputLimits,
    InvalidRecordError,
    KeySpace,
    Lifetime,
    PlainRecord,
    PlainRecords,
    RedisConfig,
    SchemaRegistry,
    StoreUnavailableError,
    UnavailableError,
    message_id_for,
)
from eoguard.codec import EnvelopeCodec, EnvelopeHeads, read_plain
from eoguard.codec.envelope_codec import MAGIC
from eoguard.stack.feed import envelope

NOW = 1_800_000_000_000
MAX_TTL = 30 * 86_400_000
LIMITS = InputLimits()


def by_order(rec: PlainRecord) -> str:
    return message_id_for("orders", str(rec.value["order_id"]))


RULES = PlainRecords(deserializer=json.loads, id_rule=by_order, lifetime=Lifetime(ttl_s=600))


def read(rules: PlainRecords, value: bytes | None, *, timestamp_ms: int | None = NOW,
         headers: Any = None, limits: InputLimits = LIMITS) -> Any:
    return read_plain(rules, value, key=b"k", headers=headers, timestamp_ms=timestamp_ms,
                      topic="orders", partition=2, offset=7, now_ms=NOW, max_ttl_ms=MAX_TTL,
                      limits=limits)


def test_a_plain_record_gets_its_id_and_expiry_from_the_rules() -> None:
    env, payload = read(RULES, b'{"order_id": 17}', headers=[("trace", b"abc"), ("none", None)])
    assert payload == {"order_id": 17}
    assert env.id == message_id_for("orders", "17")
    assert env.expires_at_ms == NOW + 600_000
    assert env.created_at_ms == NOW
    assert (env.producer, env.attempt, env.payload_schema) == ("", 1, None)
    assert env.payload == b'{"order_id": 17}'
    assert env.headers == {"trace": "abc"}


def test_an_id_in_another_spelling_is_normalised() -> None:
    mid = str(uuid.uuid4())
    rules = PlainRecords(deserializer=bytes, id_rule=lambda rec: mid.upper(),
                         lifetime=Lifetime(ttl_s=1))
    assert read(rules, b"x")[0].id == mid


@pytest.mark.parametrize(("id_rule", "words"), [
    (lambda rec: rec.value["missing"], "id rule raised KeyError"),
    (lambda rec: "order-17", "'order-17', not a UUID string"),
    (lambda rec: "", "'', not a UUID string"),
    (lambda rec: None, "None, not a UUID string"),
    (lambda rec: uuid.uuid4(), "not a UUID string"),  # a UUID object, not its text
    (lambda rec: 17, "17, not a UUID string"),
    (lambda rec: "7" * 5000, "not a UUID string"),
])
def test_an_id_rule_that_raises_or_returns_nonsense_is_refused(id_rule: Any, words: str) -> None:
    rules = PlainRecords(deserializer=json.loads, id_rule=id_rule, lifetime=Lifetime(ttl_s=60))
    with pytest.raises(InvalidRecordError) as caught:
        read(rules, b'{"order_id": 1}')
    assert caught.value.rule == "id"
    assert words in str(caught.value)
    assert len(str(caught.value)) < 200  # an overlong id is not copied into the reason


def test_a_value_the_deserializer_refuses_is_refused() -> None:
    with pytest.raises(InvalidRecordError) as caught:
        read(RULES, b"not json")
    assert caught.value.rule == "value"
    assert "JSONDecodeError" in str(caught.value)


def test_an_oversized_value_is_refused_before_it_is_deserialized() -> None:
    seen: list[bytes] = []
    rules = PlainRecords(deserializer=seen.append, id_rule=by_order, lifetime=Lifetime(ttl_s=1))
    with pytest.raises(InvalidRecordError) as caught:
        read(rules, b"x" * 11, limits=InputLimits(payload_bytes=10))
    assert caught.value.rule == "size"
    assert seen == []


@pytest.mark.parametrize(("lifetime", "value", "timestamp", "headers", "words"), [
    (Lifetime(ttl_s=60), b'{"order_id": 1}', None, None, "no timestamp"),
    (Lifetime(header="expires"), b'{"order_id": 1}', NOW, None, "KeyError"),
    (Lifetime(header="expires"), b'{"order_id": 1}', NOW, [("expires", b"soon")], "ValueError"),
    (Lifetime(field="expires_at"), b'{"order_id": 1}', NOW, None, "KeyError"),
    (Lifetime(field="expires_at"), b'{"order_id": 1, "expires_at": "x"}', NOW, None,
     "an expiry is an integer"),
    (Lifetime(field="expires_at"), b'{"order_id": 1, "expires_at": 1.5}', NOW, None,
     "an expiry is an integer"),
    (Lifetime(rule=lambda rec: 1 / 0), b'{"order_id": 1}', NOW, None, "ZeroDivisionError"),
    (Lifetime(field="expires_at"), f'{{"order_id": 1, "expires_at": {NOW + MAX_TTL + 300_001}}}'
     .encode(), NOW, None, "beyond now + max_ttl"),
    (Lifetime(ttl_s=86_400), b'{"order_id": 1}', NOW + MAX_TTL, None, "beyond now + max_ttl"),
])
def test_a_lifetime_that_fails_or_lies_beyond_max_ttl_is_refused(
        lifetime: Lifetime, value: bytes, timestamp: int | None, headers: Any,
        words: str) -> None:
    rules = PlainRecords(deserializer=json.loads, id_rule=by_order, lifetime=lifetime)
    with pytest.raises(InvalidRecordError) as caught:
        read(rules, value, timestamp_ms=timestamp, headers=headers)
    assert caught.value.rule == "lifetime"
    assert words in str(caught.value)


def test_each_kind_of_lifetime_gives_the_expiry() -> None:
    at = NOW + 5_000
    by_header = PlainRecords(deserializer=json.loads, id_rule=by_order,
                             lifetime=Lifetime(header="expires"))
    assert read(by_header, b'{"order_id": 1}', headers=[("expires", str(at).encode())]
                )[0].expires_at_ms == at
    by_field = PlainRecords(deserializer=json.loads, id_rule=by_order,
                            lifetime=Lifetime(field="until"))
    assert read(by_field, json.dumps({"order_id": 1, "until": at}).encode())[0].expires_at_ms == at
    by_rule = PlainRecords(deserializer=json.loads, id_rule=by_order,
                           lifetime=Lifetime(rule=lambda rec: rec.timestamp_ms + 1))
    assert read(by_rule, b'{"order_id": 1}')[0].expires_at_ms == NOW + 1
    # Expired already: read, not refused (the consumer drops it like an expired envelope).
    assert read(RULES, b'{"order_id": 1}', timestamp_ms=NOW - 700_000)[0].expires_at_ms < NOW


@pytest.mark.parametrize("kwargs", [
    {},
    {"ttl_s": 60, "header": "h"},
    {"ttl_s": 0},
    {"ttl_s": -1},
    {"ttl_s": float("inf")},
    {"ttl_s": True},
    {"header": ""},
    {"field": 3},
    {"rule": "not callable"},
])
def test_a_lifetime_is_checked_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Lifetime(**kwargs)


def test_plain_records_are_checked_at_construction() -> None:
    with pytest.raises(ConfigError, match="deserializer"):
        PlainRecords(deserializer="json", id_rule=by_order, lifetime=Lifetime(ttl_s=1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="id_rule"):
        PlainRecords(deserializer=json.loads, id_rule=None, lifetime=Lifetime(ttl_s=1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Lifetime"):
        PlainRecords(deserializer=json.loads, id_rule=by_order, lifetime=60)  # type: ignore[arg-type]


def consumer_config(**kw: Any) -> ConsumerConfig:
    return ConsumerConfig(kafka={"bootstrap.servers": "k:9092", "group.id": "g"},
                          redis=RedisConfig(url="redis://x:1/0"), scope="app", topics=("t",),
                          **kw)


def test_the_consumer_config_takes_plain_records_within_max_ttl() -> None:
    assert consumer_config(plain_records=RULES).plain_records is RULES
    assert consumer_config().plain_records is None
    long = PlainRecords(deserializer=json.loads, id_rule=by_order,
                        lifetime=Lifetime(ttl_s=3_600.001))
    with pytest.raises(ConfigError, match="max_ttl"):
        consumer_config(plain_records=long, keyspace=KeySpace(max_ttl_ms=3_600_000))
    with pytest.raises(ConfigError, match="PlainRecords"):
        consumer_config(plain_records={"deserializer": json.loads})


def test_an_envelope_is_told_from_a_plain_record_by_its_first_ten_bytes() -> None:
    heads = EnvelopeHeads(SchemaRegistry.default())
    codec = EnvelopeCodec()
    assert heads.holds(codec.encode(envelope(b"x")))
    assert len(heads.heads) >= 2  # the current version and the ones in history/
    assert not heads.holds(None)
    assert not heads.holds(b"")
    assert not heads.holds(b'{"order_id": 1}')
    assert not heads.holds(MAGIC)  # the marker alone
    # An Avro single-object record of another schema is plain: its fingerprint is not an
    # envelope's.
    order = SchemaRegistry.default().get("eoguard.example.Order")
    assert not heads.holds(MAGIC + order.fingerprint + b"\x00" * 20)
    # A truncated envelope keeps its head: read (and refused) as an envelope, never as plain.
    assert heads.holds(codec.encode(envelope(b"x"))[:12])


def test_an_expiry_before_the_record_timestamp_is_refused_like_an_envelopes() -> None:
    """An adversarial read (adv5) found an expiry before the record's timestamp (epoch seconds
    in a field meant for epoch ms) read with created_at lowered to it, then dropped as expired:
    every record of such a topic silently lost, counted only in stats().expired. An envelope
    with it is malformed (§3); a plain record now is too, its reason naming the likely units
    mistake."""
    rules = PlainRecords(deserializer=json.loads, id_rule=by_order,
                         lifetime=Lifetime(field="expires_at"))
    in_seconds = json.dumps({"order_id": 1, "expires_at": NOW // 1000 + 3600}).encode()
    with pytest.raises(InvalidRecordError) as caught:
        read(rules, in_seconds)
    assert caught.value.rule == "lifetime"
    assert "before the record's timestamp" in str(caught.value)
    assert "seconds" in str(caught.value)
    env, _ = read(rules, json.dumps({"order_id": 1, "expires_at": NOW}).encode())
    assert env.expires_at_ms == env.created_at_ms == NOW  # equal is allowed, as for envelopes


@pytest.mark.parametrize("outage", [
    ConnectionError("Schema Registry: connection refused"),
    TimeoutError("Schema Registry: timed out"),
    StoreUnavailableError("the application's own Redis is down"),
])
@pytest.mark.parametrize("where", ["deserializer", "id_rule", "lifetime"])
def test_an_outage_a_rule_reports_is_unavailable_not_malformed(outage: Exception,
                                                               where: str) -> None:
    """An adversarial read (adv5) found a deserializer failing for its service being down
    (AvroDeserializer with Schema Registry unreachable) made the record malformed, so valid
    records were dead-lettered for good. An UnavailableError, ConnectionError or TimeoutError
    is raised as an UnavailableError (the consumer re-reads the record), never as
    InvalidRecordError."""
    def down(*_: object) -> Any:
        raise outage
    rules = PlainRecords(
        deserializer=down if where == "deserializer" else json.loads,
        id_rule=down if where == "id_rule" else by_order,
        lifetime=Lifetime(rule=down) if where == "lifetime" else Lifetime(ttl_s=600))
    with pytest.raises(UnavailableError) as caught:
        read(rules, b'{"order_id": 1}')
    assert not isinstance(caught.value, InvalidRecordError)
    assert caught.value.__cause__ is outage
    assert "orders[2]@7" in str(caught.value)
