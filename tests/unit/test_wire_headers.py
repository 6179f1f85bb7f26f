"""The header wire format's pure rules (codec/headers.py, codec/registry_payloads.py): the
header names and their values, RFC 3339 times, reserved names, which records are in the
format, every missing or malformed header (InvalidEnvelopeError, rule ``headers``), and the
Schema Registry framing."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eoguard.codec import check_envelope
from eoguard.codec import headers as headers_module
from eoguard.codec.headers import (
    ATTEMPT,
    AVRO_CONTENT_TYPE,
    BYTES_CONTENT_TYPE,
    BYTES_TYPE,
    CONTENT_TYPE,
    EXPIRY_TIME,
    ID,
    MARKER,
    PRODUCER,
    RESERVED,
    SOURCE,
    SPEC_VERSION,
    TIME,
    TYPE,
    app_headers,
    check_app_headers,
    format_time,
    header_envelope,
    header_payload,
    parse_time,
    read_headers,
    write_headers,
)
from eoguard.codec.registry_payloads import FRAME_SIZE, frame, subject_for, unframe
from eoguard.codec.rules import InputLimits
from eoguard.errors import BadMagicError, CodecError, InvalidEnvelopeError, ReservedHeaderError

CREATED = 1_800_000_000_123
EXPIRES = CREATED + 600_000
MID = str(uuid.UUID(int=7, version=4))


def written(schema: str | None = "shop.Order", app: dict[str, str] | None = None
            ) -> dict[str, str]:
    return write_headers(MID, CREATED, EXPIRES, attempt=1, producer="host-1-abc",
                         source="/orders", schema=schema, app=app)


def as_kafka(headers: dict[str, str]) -> list[tuple[str, bytes]]:
    """What confluent-kafka's Message.headers() returns: names as text, values as bytes."""
    return [(k, v.encode()) for k, v in headers.items()]


def test_an_avro_send_writes_the_cloudevents_attributes_and_eoguards_extensions() -> None:
    assert written() == {
        SPEC_VERSION: "1.0", ID: MID, TIME: "2027-01-15T08:00:00.123Z",
        EXPIRY_TIME: "2027-01-15T08:10:00.123Z", SOURCE: "/orders", TYPE: "shop.Order",
        ATTEMPT: "1", PRODUCER: "host-1-abc", CONTENT_TYPE: AVRO_CONTENT_TYPE,
    }
    assert all(len(name) - len("ce_") <= 20 for name in written() if name.startswith("ce_"))


def test_a_raw_send_names_bytes_and_may_give_its_content_type_source_and_type() -> None:
    raw = written(schema=None)
    assert raw[TYPE] == BYTES_TYPE
    assert raw[CONTENT_TYPE] == BYTES_CONTENT_TYPE
    given_ = written(schema=None, app={"Content-Type": "application/json",
                                       SOURCE: "/shop/eu", TYPE: "shop.order.created"})
    assert CONTENT_TYPE not in given_  # the application's spelling replaces eoguard's
    assert given_["Content-Type"] == "application/json"
    assert (given_[SOURCE], given_[TYPE]) == ("/shop/eu", "shop.order.created")


@pytest.mark.parametrize("name", [*sorted(RESERVED), "CE_ID", "Ce_EoguardAttempt"])
def test_a_send_with_a_reserved_header_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ReservedHeaderError) as caught:
        check_app_headers({name: "x", "trace": "t"}, raw=False)
    assert caught.value.header == name


def test_a_raw_send_may_not_claim_the_avro_content_type() -> None:
    check_app_headers({"content-type": "text/plain", SOURCE: "/s", TYPE: "t"}, raw=True)
    with pytest.raises(ReservedHeaderError, match="not application/avro"):
        check_app_headers({"content-type": "Application/Avro"}, raw=True)


def test_a_raw_send_may_name_its_content_type_once() -> None:
    """Two spellings of content-type would be one header twice on the record, which every
    reader refuses (the record would go to the dead letters of each consumer)."""
    with pytest.raises(ReservedHeaderError, match="more than once"):
        check_app_headers({"Content-Type": "application/json", "content-type": "text/plain"},
                          raw=True)


@pytest.mark.parametrize(("text", "ms"), [
    ("2027-01-15T08:00:00.123Z", CREATED),
    ("2027-01-15t08:00:00.123z", CREATED),
    ("2027-01-15T08:00:00.123456789Z", CREATED),  # beyond milliseconds: cut
    ("2027-01-15T10:30:00.123+02:30", CREATED),
    ("2027-01-15T07:00:00.123-01:00", CREATED),
    ("2027-01-15T08:00:00Z", CREATED - 123),
    ("2027-01-15T08:00:00.1Z", CREATED - 23),
])
def test_rfc3339_times_in_any_offset_read_as_epoch_milliseconds(text: str, ms: int) -> None:
    assert parse_time(text) == ms


@pytest.mark.parametrize("text", [
    "", "2027-01-15", "2027-01-15 08:00:00Z", "2027-01-15T08:00:00", "2027-13-01T00:00:00Z",
    "2027-02-29T00:00:00Z", "2027-01-15T24:00:00Z", "2027-01-15T08:00:00+24:00",
    "1800000000123", "2027-01-15T08:00:00.Z",
    "\u0662\u0660\u0662\u0667-01-15T08:00:00Z",  # Arabic-Indic digits "2027-01-15T08:00:00.123Z ",
])
def test_what_is_not_rfc3339_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"RFC 3339|valid|offset"):
        parse_time(text)


@given(st.integers(min_value=0, max_value=253_402_300_799_999))
def test_format_time_and_parse_time_round_trip(ms: int) -> None:
    text = format_time(ms)
    assert parse_time(text) == ms
    assert dt.datetime.fromisoformat(text.replace("Z", "+00:00")) == \
        dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).replace(
            microsecond=ms % 1000 * 1000)


def test_headers_read_back_what_was_written_and_hand_the_rest_to_the_application() -> None:
    fields = read_headers([*as_kafka(written(app={"trace": "t-1"})), ("empty", None)])
    assert fields is not None
    assert (fields.id, fields.created_at_ms, fields.expires_at_ms, fields.attempt,
            fields.producer, fields.avro) == (MID, CREATED, EXPIRES, 1, "host-1-abc", True)
    assert fields.app == {SOURCE: "/orders", TYPE: "shop.Order", "trace": "t-1"}
    assert fields.app == app_headers(written(app={"trace": "t-1"}))
    raw = read_headers(as_kafka(written(schema=None, app={"content-type": "text/csv"})))
    assert raw is not None
    assert not raw.avro


@pytest.mark.parametrize("headers", [
    None, [], [("trace", b"x")],
    # a CloudEvents record of another producer: its ids are not eoguard's
    [(SPEC_VERSION, b"1.0"), (ID, b"order-17"), (SOURCE, b"/shop"), (TYPE, b"t"),
     (TIME, b"nonsense")],
    # what a plain record may do with names eoguard reserves, without the marker
    [(CONTENT_TYPE, b"a"), (CONTENT_TYPE, b"b"), (ID, None), (TIME, b"\xff")],
])
def test_a_record_without_the_marker_is_not_in_the_header_format(
        headers: list[tuple[str, bytes | None]] | None) -> None:
    assert read_headers(headers) is None


def _without(name: str) -> list[tuple[str, bytes | None]]:
    return [(k, v) for k, v in as_kafka(written()) if k != name]


def _with(name: str, value: bytes | None) -> list[tuple[str, bytes | None]]:
    return [(k, value if k == name else v) for k, v in as_kafka(written())]


@pytest.mark.parametrize(("headers", "reason"), [
    (_without(ID), "missing header ce_id"),
    (_without(TIME), "missing header ce_time"),
    (_without(EXPIRY_TIME), "missing header ce_expirytime"),
    (_without(PRODUCER), "missing header ce_eoguardproducer"),
    (_without(SPEC_VERSION), "missing header ce_specversion"),
    (_without(CONTENT_TYPE), "missing header content-type"),
    ([(MARKER, b"1")], "missing headers ce_specversion, ce_id, ce_time, ce_expirytime, "
                       "ce_eoguardproducer, content-type"),
    (_with(SPEC_VERSION, b"0.3"), "ce_specversion is '0.3', not '1.0'"),
    (_with(ATTEMPT, b"0"), "ce_eoguardattempt '0' is not a whole number"),
    (_with(ATTEMPT, b"-1"), "ce_eoguardattempt '-1'"),
    (_with(ATTEMPT, b"2147483648"), "ce_eoguardattempt '2147483648'"),
    (_with(ATTEMPT, "\u0661".encode()), "is not a whole number"),  # an Arabic-Indic one
    (_with(TIME, b"1800000000123"), "ce_time '1800000000123' is not an RFC 3339 time"),
    (_with(EXPIRY_TIME, b"2027-02-30T00:00:00Z"), "ce_expirytime '2027-02-30T00:00:00Z'"),
    (_with(ID, None), "header ce_id has no value"),
    (_with(PRODUCER, b"\xff\xfe"), "header ce_eoguardproducer is not UTF-8 text"),
    ([*as_kafka(written()), ("CE_ID", MID.encode())], "header ce_id appears more than once"),
])
def test_a_missing_or_malformed_header_is_refused_naming_it(
        headers: list[tuple[str, bytes | None]], reason: str) -> None:
    with pytest.raises(InvalidEnvelopeError) as caught:
        read_headers(headers)
    assert caught.value.rule == "headers"
    assert reason in str(caught.value)


def test_the_input_rules_judge_a_header_record_as_an_envelope() -> None:
    fields = read_headers(_with(ID, MID.upper().encode()))
    assert fields is not None
    env = check_envelope(header_envelope(fields, b"\x00\x00\x00\x00\x01body"), now_ms=CREATED,
                         max_ttl_ms=86_400_000, limits=InputLimits())
    assert env.id == MID  # normalised as an envelope's
    assert (env.payload_schema, env.payload) == (None, b"\x00\x00\x00\x00\x01body")
    bad = read_headers(_with(ID, b"order-17"))
    assert bad is not None
    with pytest.raises(InvalidEnvelopeError, match="is not a UUID") as caught:
        check_envelope(header_envelope(bad, b""), now_ms=CREATED, max_ttl_ms=86_400_000,
                       limits=InputLimits())
    assert caught.value.rule == "id"
    backwards = read_headers(_with(EXPIRY_TIME, format_time(CREATED - 1).encode()))
    assert backwards is not None
    with pytest.raises(InvalidEnvelopeError, match="before created_at"):
        check_envelope(header_envelope(backwards, b""), now_ms=CREATED,
                       max_ttl_ms=86_400_000, limits=InputLimits())


def test_a_raw_payload_is_handed_as_it_is_and_an_avro_one_needs_a_registry() -> None:
    raw = read_headers(as_kafka(written(schema=None)))
    avro = read_headers(as_kafka(written()))
    assert raw is not None
    assert avro is not None
    assert header_payload(raw, b'{"a": 1}', None) == b'{"a": 1}'
    assert header_payload(raw, None, None) == b""
    with pytest.raises(CodecError, match="no schema_registry"):
        header_payload(avro, frame(1, b"\x02"), None)
    asked: list[int | None] = []

    def framed(value: bytes | None, created_at_ms: int | None) -> tuple[str, str]:
        asked.append(created_at_ms)
        return "decoded", "shop.Order"

    assert header_payload(avro, frame(1, b"\x02"), framed) == "decoded"
    assert asked == [CREATED]  # the record's creation time, for the unknown ids' cache


def test_framing_is_the_magic_byte_the_big_endian_id_and_the_body() -> None:
    value = frame(0x01020304, b"body")
    assert value == b"\x00\x01\x02\x03\x04body"
    assert unframe(value) == (0x01020304, b"body")
    assert subject_for("orders") == "orders-value"


@pytest.mark.parametrize(("value", "reason"), [
    (None, "no value"), (b"", "0 bytes"), (b"\x00\x00\x00\x00\x01", f"5 bytes, need more than "
                                                                   f"{FRAME_SIZE}"),
    (b"\xc3\x01\x00\x00\x00\x01", "starts with c3, expected 00"),
    (b'{"order": 1}', "starts with 7b"),
])
def test_a_value_that_is_not_framed_is_a_bad_prefix(value: bytes | None, reason: str) -> None:
    with pytest.raises(BadMagicError, match=reason):
        unframe(value)


def _outcome(read: Any, raw: list[tuple[str, Any]]) -> object:
    try:
        return read(raw)
    except InvalidEnvelopeError as exc:
        return str(exc)


@given(slot=st.integers(0, 8), name=st.sampled_from([None, "CE_ID", "ce_time", "trace"]),
       value=st.one_of(st.none(), st.binary(max_size=30), st.text(max_size=30),
                       st.sampled_from([b"1.0", b"2", b"0", b"2147483648", b"application/AVRO",
                                        format_time(CREATED).encode(),
                                        b"2026-11-28T12:00:00+01:00", b"\xff\xfe"])),
       schema=st.sampled_from([None, "shop.Order"]))
def test_the_short_path_of_eoguards_own_headers_reads_as_the_general_one(
        slot: int, name: str | None, value: object, schema: str | None) -> None:
    """read_headers' path for the nine headers eoguard writes, in its order, gives what the
    general path gives for them, whatever one of them is changed to."""
    raw: list[tuple[str, Any]] = as_kafka(written(schema=schema))
    assert _outcome(read_headers, raw) == _outcome(headers_module._read_any, raw)
    old_name, _ = raw[slot]
    raw[slot] = (old_name if name is None else name, value)
    assert _outcome(read_headers, raw) == _outcome(headers_module._read_any, raw)
