"""An envelope encoded by eoguard travels through the real Kafka broker and comes back decoded."""

from __future__ import annotations

import datetime as dt
import decimal
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from eoguard import Envelope, EnvelopeCodec, PayloadCodec, new_message_id

pytestmark = pytest.mark.integration

ORDER = "eoguard.example.Order"


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True})
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(err)

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0, "messages still in flight after 30 s"
    assert failures == []


def consume(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0
            ) -> list[tuple[bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    received: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(received) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return received


def test_envelopes_travel_through_kafka_and_decode(kafka_bootstrap: str,
                                                  new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=3)
    codec, payloads = EnvelopeCodec(), PayloadCodec()
    sent: dict[str, Envelope] = {}
    orders: dict[str, dict[str, object]] = {}
    records = []
    for i in range(60):
        if i % 2:
            value: dict[str, object] = {
                "order_id": f"o-{i}", "customer": f"c-{i % 7}",
                "amount": decimal.Decimal(f"{i}.25"), "currency": "USD",
                "items": [{"sku": f"sku-{i}", "qty": i, "unit_price": 0.5}],
                "created_at": dt.datetime(2024, 5, 1, 12, 0, i, i * 1000, tzinfo=dt.timezone.utc),
                "note": None if i % 3 else f"note {i}",
            }
            env = Envelope.create(payloads.encode(value, ORDER), ttl_ms=60_000,
                                  producer="it-producer", payload_schema=ORDER,
                                  headers={"seq": str(i)})
            orders[env.id] = value
        else:
            env = Envelope.create(f"raw-{i}".encode(), ttl_ms=60_000, producer="it-producer")
        sent[env.id] = env
        records.append((f"key-{i % 5}".encode(), codec.encode(env)))
    produce(kafka_bootstrap, topic, records)

    received = consume(kafka_bootstrap, topic, len(records))

    assert len(received) == len(records)
    decoded = {}
    for key, raw in received:
        env = codec.decode(raw)
        decoded[env.id] = env
        # The application's key is untouched: it is the key the envelope was sent with.
        assert (key, raw) in records
    assert decoded == sent
    for message_id, order in orders.items():
        # The handler's view: the order as the application built it, defaults filled in.
        assert payloads.decode_envelope(decoded[message_id]) == order | {
            "express": False, "attributes": {}}
    assert all(not env.is_expired() for env in decoded.values())
    assert new_message_id() > max(decoded)  # ids issued later sort after the sent ones
