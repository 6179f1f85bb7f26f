"""Untrusted input and payload evolution, through a GuardedConsumer on real Kafka and Redis.

A foreign producer writes envelopes that decode but break the input rules (docs/design.md §3):
each is dead-lettered with its reason, no Redis key is built from it, and the good records
around it are handled once. Ids spelled otherwise (uppercase, braced, urn:) are normalised,
not refused. Orders written by producers on an older and a newer Order schema are read by
consumers on either version.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from eoguard import InputLimits, SchemaRegistry
from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.envelope import Envelope, now_ms
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import DEFAULT_MAX_TTL_MS
from tests.consumer_kit import CODEC, drain, headers_of, read_all
from tests.schema_versions import ORDER, schema_dir
from tests.unit.codec_samples import order

pytestmark = pytest.mark.integration

LIMITS = InputLimits(payload_bytes=2_000, header_count=4, header_bytes=200, producer_chars=64)


def dedup_ids(client: redis.Redis, prefix: str) -> list[str]:
    """The message id of every claim key under ``prefix``."""
    return [k.decode().rsplit(":", 1)[1] for k in client.scan_iter(f"{prefix}:dc:*", count=1000)]


def with_(env: Envelope, **fields: Any) -> bytes:
    return CODEC.encode(dataclasses.replace(env, **fields))


def test_bad_envelopes_are_dead_lettered_and_never_keyed(make, new_topic, kafka_bootstrap,
                                                         redis_client, key_prefix) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    now = now_ms()
    base = envelope()
    bad: dict[str, tuple[bytes, str, str]] = {  # name: (value, rule, words in the reason)
        "empty id": (with_(base, id=""), "id", "is not a UUID"),
        "overlong id": (with_(base, id="7" * 3000), "id", "3000 characters"),
        "other text": (with_(base, id="order-17"), "id", "is not a UUID"),
        "uuid with a trailing space": (with_(base, id=f"{uuid.uuid4()} "), "id", "not a UUID"),
        "expiry before creation": (with_(base, id=str(uuid.uuid4()), created_at_ms=now,
                                         expires_at_ms=now - 1), "expiry", "before created_at"),
        "expiry beyond max_ttl": (with_(base, id=str(uuid.uuid4()), expires_at_ms=2**62),
                                  "expiry", "beyond now + max_ttl"),
        "attempt 0": (with_(base, id=str(uuid.uuid4()), attempt=0), "attempt", "below 1"),
        "oversized payload": (with_(base, id=str(uuid.uuid4()), payload=b"p" * 2_001),
                              "size", "payload is 2001 bytes"),
        "oversized producer": (with_(base, id=str(uuid.uuid4()), producer="q" * 65),
                               "size", "producer is 65 characters"),
        "too many headers": (with_(base, id=str(uuid.uuid4()),
                                   headers={f"h{i}": "v" for i in range(5)}), "size", "5 headers"),
        "oversized headers": (with_(base, id=str(uuid.uuid4()), headers={"h": "v" * 200}),
                              "size", "headers are 201 bytes"),
    }
    spelled = [str(uuid.uuid4()) for _ in range(3)]
    other_spellings = [  # normalised, handled under the canonical id
        with_(base, id=spelled[0].upper()),
        with_(base, id="{" + spelled[1] + "}"),
        with_(base, id="urn:uuid:" + spelled[2].replace("-", "")),
    ]
    good = [envelope() for _ in range(len(bad) + 1)]
    values: list[Any] = [good[0]]
    for (raw, _, _), env in zip(bad.values(), good[1:], strict=True):
        values += [raw, env]
    values += other_spellings
    values.append(with_(good[0], id=good[0].id.upper()))  # a copy in another spelling
    produce(kafka_bootstrap, topic, values)
    seen: list[str] = []
    consumer = make([topic], lambda ctx: seen.append(ctx.message_id), dead_letter_topic=dlq,
                    input_limits=LIMITS)
    want = [e.id for e in good] + spelled
    drain([consumer], lambda: len(seen) >= len(want) and consumer.stats().duplicates >= 1)
    stats = consumer.stats()
    print(f"handled={stats.handled} dead-lettered={stats.dead_lettered} "
          f"duplicates={stats.duplicates} bad kinds={len(bad)}")
    assert Counter(seen) == Counter(want)
    assert stats.duplicates == 1
    letters = read_all(kafka_bootstrap, dlq, len(bad))
    assert len(letters) == len(bad)
    by_value = {m.value(): headers_of(m) for m in letters}
    for name, (raw, _rule, words) in bad.items():
        headers = by_value[raw]
        assert headers["eoguard.error.type"] == "InvalidEnvelopeError", name
        assert headers["eoguard.error.kind"] == "malformed", name
        assert words in headers["eoguard.error.reason"], (name, headers["eoguard.error.reason"])
    assert sorted(dedup_ids(redis_client, key_prefix)) == sorted(want)


def test_an_expiry_at_the_layouts_max_ttl_is_handled(make, new_topic, kafka_bootstrap) -> None:
    topic = new_topic(1)
    env = envelope()
    edge = dataclasses.replace(env, expires_at_ms=now_ms() + DEFAULT_MAX_TTL_MS)
    produce(kafka_bootstrap, topic, [edge])
    seen: list[str] = []
    consumer = make([topic], lambda ctx: seen.append(ctx.message_id))
    drain([consumer], lambda: len(seen) >= 1)
    assert seen == [env.id]


def produce_orders(bootstrap: str, topic: str, registry: SchemaRegistry, count: int,
                   value: dict[str, Any]) -> list[str]:
    """``count`` orders encoded by an application on ``registry``'s Order version."""
    payloads, codec = PayloadCodec(registry), EnvelopeCodec(registry)
    envs = [dataclasses.replace(envelope(payload_schema=ORDER),
                                payload=payloads.encode(value, ORDER),
                                payload_fingerprint=payloads.writer_fingerprint(ORDER))
            for _ in range(count)]
    produce(bootstrap, topic, [codec.encode(e) for e in envs])
    return [e.id for e in envs]


@pytest.mark.parametrize("reader", ["older", "newer"])
def test_orders_of_both_schema_versions_are_read_by_a_consumer_on_either(
        make, new_topic, kafka_bootstrap, tmp_path: Path, reader: str) -> None:
    topic, dlq = new_topic(2), new_topic(1, prefix="dlq")
    older = SchemaRegistry.from_dir(schema_dir(tmp_path, "older"))
    newer = SchemaRegistry.from_dir(schema_dir(tmp_path, "newer"))
    newer_order = {k: v for k, v in order(gift_wrap=True).items() if k != "note"}
    ids = produce_orders(kafka_bootstrap, topic, older, 5, order())
    ids += produce_orders(kafka_bootstrap, topic, newer, 5, newer_order)
    # A version no reader has: dead-lettered with the fingerprint it names.
    alien = dataclasses.replace(envelope(payload_schema=ORDER), payload=b"\x00",
                                payload_fingerprint=b"\x01" * 8)
    produce(kafka_bootstrap, topic, [alien])
    got: dict[str, Any] = {}
    consumer = make([topic], lambda ctx: got.setdefault(ctx.message_id, ctx.payload),
                    dead_letter_topic=dlq, registry=older if reader == "older" else newer)
    drain([consumer], lambda: len(got) >= 10)
    assert sorted(got) == sorted(ids)
    if reader == "older":
        expected = [order()] * 5 + [order(note=None)] * 5
    else:
        expected = [{k: v for k, v in order(gift_wrap=False).items() if k != "note"}] * 5 + \
            [newer_order] * 5
    assert [got[i] for i in ids] == expected
    [letter] = read_all(kafka_bootstrap, dlq, 1)
    headers = headers_of(letter)
    assert headers["eoguard.error.type"] == "UnknownFingerprintError"
    assert "0101010101010101" in headers["eoguard.error.reason"]
