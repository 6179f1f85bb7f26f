"""Records the demo writes straight to the topic, bypassing the GuardedProducer.

Expired envelopes (a sender whose TTL passed before the consumer got to them) and malformed
records of every kind a consumer meets in the wild. Their positions come back from Kafka's
delivery reports, so the demo can check each one reached the dead-letter topic.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.demo.plan import ORDER_SCHEMA, make_order
from eoguard.envelope import Envelope, new_message_id, now_ms
from eoguard.errors import BrokerError


@dataclass
class Injected:
    """What was written: expired message ids, malformed records by (partition, offset)."""

    expired_ids: list[str] = field(default_factory=list)
    malformed: dict[tuple[int, int], str] = field(default_factory=dict)  # position -> kind


def _envelope(seq: int, *, created_ms: int, ttl_ms: int, producer: str) -> Envelope:
    return Envelope(id=new_message_id(), expires_at_ms=created_ms + ttl_ms, created_at_ms=created_ms,
                    producer=producer, attempt=1, payload_schema=ORDER_SCHEMA,
                    payload=PayloadCodec().encode(make_order(seq), ORDER_SCHEMA), headers={})


def malformed_values() -> dict[str, bytes | None]:
    """One record value per way a record can fail to decode."""
    codec = EnvelopeCodec()
    env = _envelope(9_999_999, created_ms=now_ms(), ttl_ms=600_000, producer="demo-broken-sender")
    good = codec.encode(env)
    return {
        "random bytes": os.urandom(48),
        "empty value": b"",
        "null value (tombstone)": None,
        "JSON instead of Avro": b'{"order_id": "order-x", "amount": "12.50"}',
        "wrong magic": b"\x00\x01" + good[2:],
        "unknown schema fingerprint": good[:2] + b"\xff" * 8 + good[10:],
        "truncated Avro body": good[: 10 + (len(good) - 10) // 2],
        "unknown payload schema": codec.encode(
            dataclasses.replace(env, payload_schema="eoguard.example.NoSuchSchema")),
        "corrupt payload": codec.encode(dataclasses.replace(env, payload=b"\xff\xfe\xfd\x00junk")),
    }


def inject(bootstrap: str, topic: str, *, expired: int) -> Injected:
    """Write ``expired`` already-expired envelopes and one record of each malformed kind."""
    out = Injected()
    errors: list[str] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "enable.idempotence": True, "linger.ms": 5})
    codec = EnvelopeCodec()
    now = now_ms()
    for i in range(expired):
        # Created two minutes ago with a one-minute TTL: a message that arrives too late.
        env = _envelope(2_000_000 + i, created_ms=now - 120_000, ttl_ms=60_000,
                        producer="demo-late-sender")
        producer.produce(topic, codec.encode(env), f"late-{i}".encode())
        out.expired_ids.append(env.id)

    def report(kind: str) -> Callable[[Any, Any], None]:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"{kind}: {err}")
            else:
                out.malformed[(msg.partition() or 0, msg.offset() or 0)] = kind
        return delivered

    for kind, value in malformed_values().items():
        producer.produce(topic, value, f"broken-{kind}".encode(), on_delivery=report(kind))
    if producer.flush(30.0) or errors:
        raise BrokerError(f"could not write the demo's injected records to {topic}: "
                          f"{'; '.join(errors) or 'flush timed out'}")
    return out
