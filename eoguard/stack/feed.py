"""Fill a topic with envelopes or raw values: the tests and the benchmarks share this.

Not the GuardedProducer: a plain idempotent ``acks=all`` producer that writes exactly the
values it is given, so a test or a benchmark controls every byte a consumer reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import Producer

from eoguard.codec import EnvelopeCodec
from eoguard.envelope import Envelope, new_message_id, now_ms
from eoguard.errors import BrokerError

_CODEC = EnvelopeCodec()


def envelope(payload: bytes = b"payload", *, ttl_ms: int = 600_000, message_id: str | None = None,
             payload_schema: str | None = None, attempt: int = 1) -> Envelope:
    """An envelope created now, expiring ``ttl_ms`` later, from producer ``test-producer``.

    A negative ``ttl_ms`` gives one that expired ``-ttl_ms`` ago, created a second before
    that (an expiry before the creation time would make it malformed, not expired).
    """
    now = now_ms()
    expires = now + ttl_ms
    created = now if ttl_ms >= 0 else expires - 1_000
    return Envelope(id=message_id or new_message_id(), expires_at_ms=expires,
                    created_at_ms=created, producer="test-producer", attempt=attempt,
                    payload_schema=payload_schema, payload=payload, headers={})


def produce(bootstrap: str, topic: str, values: Iterable[bytes | Envelope], *,
            key: bytes | None = None, keys: Sequence[bytes | None] | None = None,
            partition: int | None = None) -> int:
    """Produce values (envelopes are encoded) with acks=all; returns how many Kafka acked.
    Each record has ``key``, or with ``keys`` the key at its index.

    Raises :class:`BrokerError` if any value was not acknowledged.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    acked: list[int] = []
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        (failed.append(str(err)) if err else acked.append(1))

    count = 0
    for i, value in enumerate(values):
        raw = _CODEC.encode(value) if isinstance(value, Envelope) else value
        kwargs: dict[str, Any] = {"value": raw, "key": key if keys is None else keys[i],
                                  "on_delivery": report}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
    producer.flush(60)
    if failed or len(acked) != count:
        raise BrokerError(f"{count - len(acked)} of {count} records to {topic} not acknowledged: "
                          f"{failed[:3]}")
    return count
