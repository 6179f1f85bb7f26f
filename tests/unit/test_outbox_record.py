"""The outbox record layout: what the producer builds parses back, whole or by its head."""

from __future__ import annotations

import pytest

from eoguard.config import KeepUntil
from eoguard.store.outbox_types import OutboxRecord, RecordState, parse_record, record_body


def stored(rec: OutboxRecord, *, owner: str = "p:1", state: bytes = b"0",
           keep: KeepUntil = KeepUntil.CONSUMED) -> bytes:
    """A record's value as outbox_write.lua stores it (claim part + the body)."""
    head = b"%s:%d:%d:%d:%s" % (state, 1_000, 61_000, len(owner.encode()), owner.encode())
    return head + record_body(rec, keep.value.encode())


def record(**overrides: object) -> OutboxRecord:
    fields: dict[str, object] = {
        "id": "0190b6a5-1f2e-7c3d-8e4f-5a6b7c8d9e0f", "topic": "orders", "key": b"k:1",
        "value": b"\xc3\x01:binary:\x00\xff", "created_at_ms": 1_700_000_000_000,
        "expires_at_ms": 1_700_000_600_000}
    fields.update(overrides)
    return OutboxRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [None, b"", b"k", b"with:colons:\x00"])
@pytest.mark.parametrize("headers", [None, {}, {"trace": "a:b", "ü": "ß"}])
def test_round_trip(key: bytes | None, headers: dict[str, str] | None) -> None:
    rec = record(key=key, headers=headers, attempt=3)
    f = parse_record(stored(rec, owner="host:42:abc", keep=KeepUntil.PUBLISHED))
    assert (f.topic, f.key, f.value, f.headers) == (rec.topic, key, rec.value, headers or {})
    assert (f.attempt, f.keep_until, f.owner) == (3, KeepUntil.PUBLISHED, "host:42:abc")
    assert (f.created_at_ms, f.expires_at_ms) == (rec.created_at_ms, rec.expires_at_ms)
    assert (f.state, f.owned_at_ms, f.next_resend_at_ms) == (RecordState.PENDING, 1_000, 61_000)


def test_state_byte_published() -> None:
    assert parse_record(stored(record(), state=b"1")).state is RecordState.PUBLISHED


def test_head_parses_without_the_value() -> None:
    raw = stored(record(headers={"h": "x" * 500}, value=b"v" * 5000))
    head = raw[:200]  # ends inside the headers
    f = parse_record(head, partial=True)
    assert (f.topic, f.owner, f.expires_at_ms) == ("orders", "p:1", 1_700_000_600_000)
    with pytest.raises(ValueError, match="cut short"):
        parse_record(head)  # not partial: key and headers must be whole
    with pytest.raises(ValueError):
        parse_record(raw[:30], partial=True)  # the topic is cut: too short even for a head


def test_malformed_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_record(b"not a record")
