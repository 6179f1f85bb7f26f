"""The Avro codec: envelope values and payloads round trip; bad input raises typed errors.

Fingerprints, the reference-implementation cross-checks, evolution and the registry are
in test_codec_schemas.py.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import random
from typing import Any

import pytest
from codec_samples import ORDER, UTC, envelope, order

from eoguard import (
    BadMagicError,
    CodecError,
    CorruptRecordError,
    EnvelopeCodec,
    PayloadCodec,
    PayloadEncodeError,
    SchemaNotFoundError,
    SchemaRegistry,
    UnknownFingerprintError,
)
from eoguard.codec import HEADER_SIZE, MAGIC

# --- envelope round trips ------------------------------------------------------------------

ENVELOPE_CASES = {
    "raw-payload": {},
    "named-payload-schema": {"payload_schema": ORDER, "payload": b"\x00\x01\x02"},
    "empty-payload-and-headers": {"payload": b"", "headers": {}},
    "every-byte-value": {"payload": bytes(range(256)) * 4},
    "many-headers-unicode": {"headers": {f"k{i}": f"välue-{i}-✓" for i in range(50)},
                             "producer": "prodüçer-Ω"},
    "extreme-times": {"created_at_ms": 0, "expires_at_ms": 2**62},
    "negative-time": {"created_at_ms": -1, "expires_at_ms": -(2**40)},
    "big-attempt": {"attempt": 2**31 - 1},
    "large-payload": {"payload": random.Random(1).randbytes(1_000_000)},
}


@pytest.mark.parametrize("overrides", ENVELOPE_CASES.values(), ids=ENVELOPE_CASES.keys())
def test_envelope_round_trip(codec: EnvelopeCodec, overrides: dict[str, Any]) -> None:
    env = envelope(**overrides)
    value = codec.encode(env)
    assert value[:2] == MAGIC
    assert value[2:HEADER_SIZE] == codec.fingerprint
    decoded = codec.decode(value)
    assert decoded == env
    assert type(decoded.expires_at_ms) is int
    assert type(decoded.id) is str


def test_decode_accepts_bytearray_and_memoryview(codec: EnvelopeCodec) -> None:
    env = envelope(headers={"a": "b"})
    value = codec.encode(env)
    assert codec.decode(bytearray(value)) == env
    assert codec.decode(memoryview(value)) == env


def test_default_codec_uses_the_default_registry() -> None:
    env = envelope()
    assert EnvelopeCodec().decode(EnvelopeCodec(SchemaRegistry.default()).encode(env)) == env


def test_encoding_an_envelope_with_a_wrong_field_type_is_a_codec_error(codec: EnvelopeCodec
                                                                       ) -> None:
    with pytest.raises(CodecError, match="does not fit") as info:
        codec.encode(envelope(producer=None))
    assert info.value.__cause__ is not None


# --- payload round trips -------------------------------------------------------------------

ORDER_CASES = {
    "all-fields": {},
    "nulls-and-empties": {"note": None, "attributes": {}, "items": [], "express": False},
    "negative-amount-unicode": {"amount": decimal.Decimal("-0.01"), "customer": "Zoë ✓",
                                "currency": "JPY"},
    "many-items": {"items": [{"sku": f"S{i}", "qty": i, "unit_price": i / 3}
                             for i in range(500)]},
    "largest-amount": {"amount": decimal.Decimal("9999999999.99")},
}


@pytest.mark.parametrize("overrides", ORDER_CASES.values(), ids=ORDER_CASES.keys())
def test_order_payload_round_trip(payloads: PayloadCodec, overrides: dict[str, Any]) -> None:
    value = order(**overrides)
    data = payloads.encode(value, ORDER)
    assert payloads.decode(data, ORDER) == value


def test_order_payload_defaults_fill_omitted_fields(payloads: PayloadCodec) -> None:
    value = order()
    for optional in ("express", "attributes", "note"):
        del value[optional]
    decoded = payloads.decode(payloads.encode(value, ORDER), ORDER)
    assert decoded == value | {"express": False, "attributes": {}, "note": None}


def test_order_payload_comes_back_in_its_original_python_types(payloads: PayloadCodec) -> None:
    decoded = payloads.decode(payloads.encode(order(), ORDER), ORDER)
    assert isinstance(decoded["amount"], decimal.Decimal)
    assert decoded["created_at"] == dt.datetime(2024, 5, 1, 12, 30, 15, 123_000, tzinfo=UTC)


def test_raw_payload_round_trip(payloads: PayloadCodec) -> None:
    assert payloads.encode(b"\x00app", None) == b"\x00app"
    assert payloads.encode(bytearray(b"ab"), None) == b"ab"
    assert payloads.decode(b"\x00app", None) == b"\x00app"


def test_payload_in_an_envelope_through_both_codecs(codec: EnvelopeCodec,
                                                    payloads: PayloadCodec) -> None:
    env = envelope(payload_schema=ORDER, payload=payloads.encode(order(), ORDER))
    assert payloads.decode_envelope(codec.decode(codec.encode(env))) == order()


# --- bad input: every case has its typed error ----------------------------------------------


@pytest.mark.parametrize("value", [None, b"", b"\xc3", MAGIC, MAGIC + b"\x00" * 7],
                         ids=["none", "empty", "one-byte", "magic-only", "short-header"])
def test_too_short_values_are_bad_magic(codec: EnvelopeCodec, value: bytes | None) -> None:
    with pytest.raises(BadMagicError, match="at least 10"):
        codec.decode(value)


@pytest.mark.parametrize("magic", [b"\x00\x01", b"\xc3\x00", b"\x01\xc3", b"{\""])
def test_wrong_magic_is_bad_magic(codec: EnvelopeCodec, magic: bytes) -> None:
    value = codec.encode(envelope())
    with pytest.raises(BadMagicError, match="expected c301"):
        codec.decode(magic + value[2:])


def test_unknown_fingerprint(codec: EnvelopeCodec) -> None:
    value = codec.encode(envelope())
    unknown = bytes(8)
    with pytest.raises(UnknownFingerprintError) as info:
        codec.decode(MAGIC + unknown + value[HEADER_SIZE:])
    assert info.value.fingerprint == unknown


def test_a_known_fingerprint_of_another_schema_is_not_an_envelope(
        codec: EnvelopeCodec, registry: SchemaRegistry, payloads: PayloadCodec) -> None:
    order_fp = registry.get(ORDER).fingerprint
    with pytest.raises(UnknownFingerprintError, match="not an envelope"):
        codec.decode(MAGIC + order_fp + payloads.encode(order(), ORDER))


def test_every_truncation_of_the_body_is_corrupt(codec: EnvelopeCodec) -> None:
    value = codec.encode(envelope(headers={"k": "v"}, payload_schema=ORDER))
    for end in range(HEADER_SIZE, len(value)):
        with pytest.raises(CorruptRecordError) as info:
            codec.decode(value[:end])
        assert info.value.__cause__ is not None


def test_trailing_garbage_is_corrupt(codec: EnvelopeCodec) -> None:
    value = codec.encode(envelope())
    with pytest.raises(CorruptRecordError, match="3 trailing bytes"):
        codec.decode(value + b"xyz")


def test_invalid_utf8_in_a_string_is_corrupt(codec: EnvelopeCodec) -> None:
    value = codec.encode(envelope(producer="ab"))
    broken = value.replace(b"\x04ab", b"\x04\xff\xfe", 1)
    assert broken != value
    with pytest.raises(CorruptRecordError, match="UnicodeDecodeError"):
        codec.decode(broken)


def test_random_bytes_never_raise_anything_but_codec_errors(codec: EnvelopeCodec) -> None:
    rnd = random.Random(20240501)
    header = MAGIC + codec.fingerprint
    for _ in range(5_000):
        noise = rnd.randbytes(rnd.randint(0, 120))
        with pytest.raises(BadMagicError):
            codec.decode(b"\x00" + noise + bytes(10))
        # Valid by chance is fine too; any other exception fails the test.
        with contextlib.suppress(CorruptRecordError):
            codec.decode(header + noise)


def test_unknown_payload_schema(payloads: PayloadCodec) -> None:
    with pytest.raises(SchemaNotFoundError) as info:
        payloads.encode(order(), "eoguard.example.Missing")
    assert info.value.schema == "eoguard.example.Missing"
    with pytest.raises(SchemaNotFoundError):
        payloads.decode(b"", "eoguard.example.Missing")


NOT_AN_ORDER = {
    "missing-field": {k: v for k, v in order().items() if k != "customer"},
    "unknown-field": order(coupon="X"),
    "wrong-type": order(customer=42),
    "bad-enum-symbol": order(currency="XXX"),
    "float-for-decimal": order(amount=12.5),
    "too-many-decimals": order(amount=decimal.Decimal("1.234")),
    "int-out-of-range": order(items=[{"sku": "A", "qty": 2**40, "unit_price": 1.0}]),
    "bad-union-branch": order(note=5),
    "non-string-map-value": order(attributes={"a": 1}),
    "not-a-record": ["o-1"],
}


@pytest.mark.parametrize("value", NOT_AN_ORDER.values(), ids=NOT_AN_ORDER.keys())
def test_payload_not_matching_its_schema(payloads: PayloadCodec, value: Any) -> None:
    with pytest.raises(PayloadEncodeError, match=r"does not fit schema eoguard\.example\.Order"):
        payloads.encode(value, ORDER)


def test_raw_payload_must_be_bytes(payloads: PayloadCodec) -> None:
    with pytest.raises(PayloadEncodeError, match="must be bytes"):
        payloads.encode("text", None)


def test_corrupt_payload_bytes(payloads: PayloadCodec) -> None:
    data = payloads.encode(order(), ORDER)
    with pytest.raises(CorruptRecordError, match="not a valid"):
        payloads.decode(data[:-3], ORDER)
    with pytest.raises(CorruptRecordError, match="trailing"):
        payloads.decode(data + b"\x00", ORDER)


def test_payload_codec_without_validation_still_catches_wrong_types(registry: SchemaRegistry
                                                                    ) -> None:
    fast = PayloadCodec(registry, validate=False)
    assert fast.decode(fast.encode(order(), ORDER), ORDER) == order()
    with pytest.raises(PayloadEncodeError):
        fast.encode(order(customer=42), ORDER)
