"""Helpers shared by the consumer tests, fault workers and the consumer benchmark."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from eoguard.codec import EnvelopeCodec
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.envelope import Envelope, new_message_id, now_ms
from eoguard.guard.consumer import GuardedConsumer
from eoguard.store.keys import KeySpace

CODEC = EnvelopeCodec()


def envelope(payload: bytes = b"payload", *, ttl_ms: int = 600_000, message_id: str | None = None,
             payload_schema: str | None = None, attempt: int = 1) -> Envelope:
    created = now_ms()
    return Envelope(id=message_id or new_message_id(), expires_at_ms=created + ttl_ms,
                    created_at_ms=created, producer="test-producer", attempt=attempt,
                    payload_schema=payload_schema, payload=payload, headers={})


def produce(bootstrap: str, topic: str, values: Iterable[bytes | Envelope], *,
            key: bytes | None = None, partition: int | None = None) -> int:
    """Produce values (envelopes are encoded) with acks=all; returns how many Kafka acked."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    acked: list[int] = []
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        (failed.append(str(err)) if err else acked.append(1))

    count = 0
    for value in values:
        raw = CODEC.encode(value) if isinstance(value, Envelope) else value
        kwargs: dict[str, Any] = {"value": raw, "key": key, "on_delivery": report}
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
    assert not failed, failed[:3]
    assert len(acked) == count
    return count


def consumer_config(bootstrap: str, redis_url: str, topics: Sequence[str], *, prefix: str,
                    scope: str = "app", group: str | None = None,
                    kafka: dict[str, Any] | None = None, **overrides: Any) -> ConsumerConfig:
    conf = {"bootstrap.servers": bootstrap, "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000, **(kafka or {})}
    values: dict[str, Any] = {"poll_timeout_s": 0.2, "retry_backoff_s": 0.05,
                              "retry_backoff_max_s": 0.5, **overrides}
    return ConsumerConfig(kafka=conf, redis=RedisConfig(url=redis_url), scope=scope,
                          topics=tuple(topics), keyspace=KeySpace(prefix=prefix), **values)


def drain(consumers: Sequence[GuardedConsumer], done: Callable[[], bool], *,
          timeout_s: float = 60.0, settle_polls: int = 3) -> None:
    """Poll the consumers round-robin until ``done()``, then a few more empty polls."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "consumers did not finish in time"
        for consumer in consumers:
            consumer.poll_once()
    for _ in range(settle_polls):
        for consumer in consumers:
            consumer.poll_once()


def read_all(bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0) -> list[Any]:
    """At least ``count`` records of ``topic`` from the beginning (plain consumer)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            out += [m for m in consumer.consume(500, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return out


def headers_of(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or []) if v is not None}


def committed_total(bootstrap: str, group: str, topic: str, partitions: int) -> tuple[int, int]:
    """(sum of the group's committed offsets, sum of the partitions' end offsets)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        committed = consumer.committed(parts, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        return sum(max(tp.offset, 0) for tp in committed), sum(ends)
    finally:
        consumer.close()
