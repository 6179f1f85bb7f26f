"""Untrusted input: id spellings, business-key ids, and the envelope rules (codec/rules.py)."""

from __future__ import annotations

import dataclasses
import random
import uuid

import pytest

from eoguard import (
    ConfigError,
    InputLimits,
    InvalidEnvelopeError,
    canonical_id,
    message_id_for,
    new_message_id,
)
from eoguard.codec import check_envelope
from eoguard.envelope import namespace_uuid
from tests.unit.codec_samples import envelope

CANON = "0190f3a2-7b1c-7d2e-8f00-0123456789ab"

# (text as written, canonical form or None when it is not a UUID); the Spark decode test
# runs the same vectors through its Column expressions.
ID_VECTORS: list[tuple[str, str | None]] = [
    (CANON, CANON),
    (CANON.upper(), CANON),
    ("{" + CANON + "}", CANON),
    ("{" + CANON.upper() + "}", CANON),
    ("urn:uuid:" + CANON, CANON),
    ("URN:UUID:" + CANON.upper(), CANON),
    (CANON.replace("-", ""), CANON),
    ("", None),
    ("x" * 5000, None),
    ("not-a-uuid", None),
    (CANON + " ", None),
    (" " + CANON, None),
    (CANON[:-1] + "g", None),
    (CANON[:-1], None),
    (CANON + "0", None),
    ("{" + CANON, None),
    ("0190f3a27-b1c-7d2e-8f00-0123456789ab", None),  # hyphen out of place
    ("+190f3a2-7b1c-7d2e-8f00-0123456789ab", None),  # int() would take the sign
    ("0_90f3a2-7b1c-7d2e-8f00-0123456789ab", None),  # ... and the underscore
    ("urn:uuid:{" + CANON + "}", CANON),
]


@pytest.mark.parametrize(("text", "expected"), ID_VECTORS)
def test_canonical_id(text: str, expected: str | None) -> None:
    assert canonical_id(text) == expected


def test_canonical_id_agrees_with_uuid_on_what_both_accept() -> None:
    for _ in range(200):
        u = uuid.uuid4()
        for text in (str(u), str(u).upper(), u.hex, f"{{{u}}}", u.urn):
            assert canonical_id(text) == str(u)


def test_message_id_for_is_a_stable_uuid5() -> None:
    namespace = uuid.uuid5(uuid.UUID("6f1c9a52-3e0b-5d7a-9b44-0e6a1f3c2d18"), "orders")
    assert message_id_for("orders", "A-1") == str(uuid.uuid5(namespace, "A-1"))
    assert message_id_for("orders", b"A-1") == message_id_for("orders", "A-1")
    assert message_id_for(namespace, "A-1") == message_id_for("orders", "A-1")
    assert message_id_for("orders", "A-1") != message_id_for("refunds", "A-1")
    assert message_id_for("orders", "A-1") != message_id_for("orders", "A-2")
    assert uuid.UUID(message_id_for("orders", "ü")).version == 5


def test_message_id_for_spells_exactly_what_uuid5_does() -> None:
    """message_id_for writes the UUID from the SHA-1 hex digest itself (no UUID object per
    call): over random namespaces and keys, text and bytes, it is uuid.uuid5's string."""
    rnd = random.Random(5)
    for _ in range(20_000):
        namespace = rnd.choice(["orders", "ü", "x" * 64, ""]) or uuid.uuid4()
        text = "".join(chr(rnd.choice([rnd.randrange(32, 127), rnd.randrange(0xA0, 0xD7FF),
                                       rnd.randrange(0x10000, 0x10FFFF)]))
                       for _ in range(rnd.randrange(0, 16)))
        ns = namespace if isinstance(namespace, uuid.UUID) else namespace_uuid(namespace)
        want = uuid.uuid5(ns, text)
        assert message_id_for(namespace, text) == str(want)
        assert message_id_for(namespace, text.encode()) == str(want)
        assert (want.version, want.variant) == (5, uuid.RFC_4122)


NOW = 1_700_000_000_000
MAX_TTL = 86_400_000
LIMITS = InputLimits()


def check(**fields: object) -> object:
    defaults: dict[str, object] = {"created_at_ms": NOW, "expires_at_ms": NOW + 60_000}
    return check_envelope(envelope(**(defaults | fields)), now_ms=NOW, max_ttl_ms=MAX_TTL,
                          limits=LIMITS)


def test_a_good_envelope_passes_unchanged() -> None:
    env = envelope(created_at_ms=NOW, expires_at_ms=NOW + 60_000, id=new_message_id())
    assert check_envelope(env, now_ms=NOW, max_ttl_ms=MAX_TTL, limits=LIMITS) is env


def test_an_id_in_another_spelling_is_normalised() -> None:
    out = check(id="{" + CANON.upper() + "}")
    assert dataclasses.replace(out, id="x") == dataclasses.replace(check(id=CANON), id="x")  # type: ignore[type-var]
    assert out.id == CANON  # type: ignore[attr-defined]


@pytest.mark.parametrize(("fields", "rule", "words"), [
    ({"id": ""}, "id", "is not a UUID"),
    ({"id": "x" * 5000}, "id", "5000 characters"),
    ({"id": "order-17"}, "id", "is not a UUID"),
    ({"expires_at_ms": NOW - 1}, "expiry", "before created_at"),
    ({"expires_at_ms": 2**62}, "expiry", r"beyond now \+ max_ttl"),
    ({"created_at_ms": NOW + MAX_TTL, "expires_at_ms": NOW + MAX_TTL + 400_000}, "expiry",
     r"beyond now \+ max_ttl"),
    ({"attempt": 0}, "attempt", "below 1"),
    ({"producer": "p" * 257}, "size", "producer is 257 characters"),
    ({"payload": b"x" * (LIMITS.payload_bytes + 1)}, "size", "payload is"),
    ({"headers": {f"h{i}": "" for i in range(65)}}, "size", "65 headers"),
    ({"headers": {"h": "v" * 16_384}}, "size", "headers are 16385 bytes"),
])
def test_each_rule_refuses_with_its_reason(fields: dict[str, object], rule: str,
                                           words: str) -> None:
    with pytest.raises(InvalidEnvelopeError, match=words) as info:
        check(**fields)
    assert info.value.rule == rule


def test_expiry_within_max_ttl_and_the_clock_skew_allowance_passes() -> None:
    assert check(expires_at_ms=NOW + MAX_TTL + LIMITS.clock_skew_ms)
    assert check(expires_at_ms=NOW)  # expires as it is made: expired, not malformed


def test_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="payload_bytes"):
        InputLimits(payload_bytes=-1)
    with pytest.raises(ConfigError, match="header_count"):
        InputLimits(header_count=True)


def test_the_clock_skew_allowance_is_capped_by_grace() -> None:
    assert LIMITS.within_grace(600_000) is LIMITS
    assert LIMITS.within_grace(3_000).clock_skew_ms == 3_000
    with pytest.raises(InvalidEnvelopeError, match="beyond now"):
        check_envelope(envelope(created_at_ms=NOW, expires_at_ms=NOW + MAX_TTL + 4_000),
                       now_ms=NOW, max_ttl_ms=MAX_TTL, limits=LIMITS.within_grace(3_000))
