"""Hostile input, property-based: batches of broken records among good ones, per example.

Each example writes a fresh topic: good envelopes with, between them, records drawn from
every way a record can be broken (bit flips, truncation, huge and negative Avro length
prefixes, wrong fingerprints, garbage or unknown payload schemas, ids that are not UUIDs,
absurd expiries, null and empty values, oversized headers) and valid envelopes of a foreign
producer with uuid4 ids. A GuardedConsumer reads it all. Whether a mutated record is still a
valid envelope is decided by the codec and the input rules (a bit flip in a payload byte
leaves a valid record); the kinds that can never be valid are asserted to be refused. Then:
no crash, the partition read to its end, every refused record dead-lettered with its reason,
every valid record handled once, and no Redis key built from a refused one.

Profiles: ``ci`` (the default: derandomised, 20 examples) and ``explore``
(``HYPOTHESIS_PROFILE=explore``: random, 100 examples).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eoguard import InputLimits
from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.codec.rules import check_envelope
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.envelope import now_ms
from eoguard.errors import CodecError
from eoguard.stack import create_topics
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import DEFAULT_MAX_TTL_MS
from tests.consumer_kit import CODEC, consumer_config, drain, headers_of, read_all

pytestmark = pytest.mark.integration

LIMITS = InputLimits(payload_bytes=2_000, header_count=4, header_bytes=200, producer_chars=64,
                     clock_skew_ms=3_000)
ORDER = "eoguard.example.Order"
_SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", derandomize=True, database=None, max_examples=20, deadline=None,
                          suppress_health_check=_SLOW, print_blob=True)
settings.register_profile("explore", max_examples=100, deadline=None, suppress_health_check=_SLOW,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Kinds whose records no codec version may accept: the oracle must refuse them too.
ALWAYS_BAD = {"truncated", "length prefix", "wrong fingerprint", "unknown payload schema",
              "null", "empty", "huge expiry", "expiry before creation", "oversized headers"}


def _varint(n: int) -> bytes:
    """Avro's zigzag varint of a long (how every string and bytes length is spelled)."""
    z = ((n << 1) ^ (n >> 63)) & (2**64 - 1)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@st.composite
def broken(draw: st.DrawFn) -> tuple[str, Any]:
    """One hostile record: (kind, value) where value is bytes, None or an envelope's bytes."""
    base = envelope(draw(st.binary(max_size=64)))
    good = CODEC.encode(base)
    kind = draw(st.sampled_from([
        "bit flip", "truncated", "length prefix", "wrong fingerprint", "garbage payload",
        "unknown payload schema", "not a uuid", "huge expiry", "expiry before creation",
        "null", "empty", "oversized headers", "foreign producer"]))
    if kind == "bit flip":
        bit = draw(st.integers(0, len(good) * 8 - 1))
        flipped = bytearray(good)
        flipped[bit // 8] ^= 1 << (bit % 8)
        return kind, bytes(flipped)
    if kind == "truncated":
        return kind, good[:draw(st.integers(0, len(good) - 1))]
    if kind == "length prefix":  # the id's length: huge, or negative
        length = draw(st.one_of(st.integers(2**31, 2**62), st.integers(-(2**62), -1)))
        return kind, good[:10] + _varint(length) + draw(st.binary(max_size=32))
    if kind == "wrong fingerprint":
        fingerprint = draw(st.binary(min_size=8, max_size=8).filter(lambda b: b != good[2:10]))
        return kind, good[:2] + fingerprint + good[10:]
    if kind == "garbage payload":
        return kind, _with(base, payload_schema=ORDER, payload=draw(st.binary(max_size=80)))
    if kind == "unknown payload schema":
        name = "no.such." + draw(st.text("abcdefghXYZ", min_size=1, max_size=20))
        return kind, _with(base, payload_schema=name)
    if kind == "not a uuid":
        return kind, _with(base, id=draw(st.text(max_size=60)))
    if kind == "huge expiry":
        beyond = draw(st.integers(86_400_000, 2**62))  # past now + max_ttl + a day, up to 2**63
        return kind, _with(base, expires_at_ms=min(now_ms() + DEFAULT_MAX_TTL_MS + beyond, 2**63 - 1))
    if kind == "expiry before creation":
        return kind, _with(base, expires_at_ms=base.created_at_ms - draw(st.integers(1, 2**40)))
    if kind == "null":
        return kind, None
    if kind == "empty":
        return kind, b""
    if kind == "oversized headers":
        size = draw(st.integers(LIMITS.header_bytes, 5_000))
        return kind, _with(base, headers={"h": "v" * size})
    return kind, _with(base, id=str(uuid.uuid4()), producer="foreign-app")  # foreign producer


def _with(env: Any, **fields: Any) -> bytes:
    return CODEC.encode(dataclasses.replace(env, **fields))


def verdict(value: bytes | None) -> str | None:
    """The canonical id the consumer must handle ``value`` under; None: it must refuse it;
    ``"expired"``: a valid envelope whose expiry passed (a bit flip can make one)."""
    try:
        env = check_envelope(EnvelopeCodec().decode(value), now_ms=now_ms(),
                             max_ttl_ms=DEFAULT_MAX_TTL_MS, limits=LIMITS)
        if env.payload_schema is not None:
            PayloadCodec().decode(env.payload, env.payload_schema, env.payload_fingerprint)
    except CodecError:
        return None
    return "expired" if env.expires_at_ms <= now_ms() + 5_000 else env.id


@dataclasses.dataclass
class Planted:
    """One example's topic: good envelopes around each hostile record, and what a reader must
    make of it (keys are offsets): ids to handle, records to refuse (by kind), valid records
    already expired, and valid ones expiring within ``soon_ms`` (a slow reader may find them
    expired)."""

    values: list[Any] = dataclasses.field(default_factory=list)
    handled: list[str] = dataclasses.field(default_factory=list)
    refused: dict[int, str] = dataclasses.field(default_factory=dict)
    expired: set[int] = dataclasses.field(default_factory=set)
    soon: dict[int, str] = dataclasses.field(default_factory=dict)


def plant(records: list[tuple[str, Any]], *, soon_ms: int = 0) -> Planted:
    """Interleave ``records`` with good envelopes (one before each, one at the end), each
    hostile record judged by :func:`verdict`."""
    out = Planted()
    for kind, value in records:
        good = envelope()
        out.values.append(CODEC.encode(good))
        out.handled.append(good.id)
        handled_as = verdict(value)
        if kind in ALWAYS_BAD:
            assert handled_as is None, f"a {kind} record passed the input rules"
        if handled_as is None:
            out.refused[len(out.values)] = kind
        elif handled_as == "expired":
            out.expired.add(len(out.values))
        elif soon_ms and EnvelopeCodec().decode(value).expires_at_ms <= now_ms() + soon_ms:
            out.soon[len(out.values)] = handled_as  # a bit flip in the expiry
        else:
            out.handled.append(handled_as)
        out.values.append(value)
    out.values.append(CODEC.encode(last := envelope()))
    out.handled.append(last.id)
    return out


@given(records=st.lists(broken(), min_size=3, max_size=10))
def test_hostile_records_are_dead_lettered_and_the_good_ones_around_them_handled_once(
        records: list[tuple[str, Any]], kafka_bootstrap: str, redis_url: str,
        redis_client: redis.Redis) -> None:
    run = uuid.uuid4().hex[:10]
    topic, dlq, prefix = f"hostile-{run}", f"hostile-{run}.dlq", f"h{run}"
    create_topics(kafka_bootstrap, {topic: 1, dlq: 1})
    planted = plant(records)
    values, expect_handled, expect_refused = planted.values, planted.handled, planted.refused
    expired = len(planted.expired)
    produce(kafka_bootstrap, topic, values, partition=0)

    seen: list[str] = []
    config = consumer_config(kafka_bootstrap, redis_url, [topic],
                             prefix=prefix, scope="hostile", dead_letter_topic=dlq,
                             input_limits=LIMITS, grace_s=60.0)
    consumer = GuardedConsumer(config, handler=lambda ctx: seen.append(ctx.message_id))
    try:
        drain([consumer], lambda: consumer.stats().polled >= len(values)
              and consumer.stats().dead_lettered >= len(expect_refused), timeout_s=60)
        stats = consumer.stats()
    finally:
        consumer.close()
    assert Counter(seen) == Counter(expect_handled)
    assert stats.expired == expired
    letters = read_all(kafka_bootstrap, dlq, len(expect_refused)) if expect_refused else []
    reasons = {int(headers_of(m)["eoguard.source.offset"]): headers_of(m) for m in letters}
    assert sorted(reasons) == sorted(expect_refused), \
        f"dead-lettered {sorted(reasons)}, refused {expect_refused}"
    for offset, headers in reasons.items():
        assert headers["eoguard.error.kind"] == "malformed", expect_refused[offset]
        assert headers["eoguard.error.reason"], expect_refused[offset]
    keyed = {k.decode().rsplit(":", 1)[1]
             for k in redis_client.scan_iter(f"{prefix}:dc:*", count=1000)}
    assert keyed == set(expect_handled)

