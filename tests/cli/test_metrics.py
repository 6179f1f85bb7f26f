"""Prometheus export of the producer's and consumer's stats() and of the outbox's age."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import eoguard.metrics
from eoguard.config import ConsumerConfig, ProducerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.metrics import (
    CONSUMER_METRICS,
    PRODUCER_METRICS,
    register_consumer,
    register_outbox,
    register_producer,
)
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace

pytestmark = pytest.mark.integration


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_every_documented_name_is_in_the_module_doc() -> None:
    for name, kind, _, _ in [*PRODUCER_METRICS.values(), *CONSUMER_METRICS.values()]:
        exported = f"{name}_total" if kind == "counter" else name
        assert exported in (eoguard.metrics.__doc__ or ""), exported


def test_producer_and_consumer_stats_exported(redis_url, kafka_bootstrap, key_prefix, new_topic) -> None:
    topic = new_topic(partitions=1)
    keys = KeySpace(prefix=key_prefix)
    producer = GuardedProducer(ProducerConfig(
        kafka={"bootstrap.servers": kafka_bootstrap}, redis=RedisConfig(url=redis_url), keyspace=keys))
    registry = CollectorRegistry()
    try:
        for i in range(3):
            producer.send(topic, f"v{i}".encode())
        assert producer.flush(30) == 0
        register_producer(producer, registry=registry)
        instance = producer.instance_id
        assert sample(registry, "eoguard_producer_sent_total", instance=instance) == 3
        assert sample(registry, "eoguard_producer_guaranteed_total", instance=instance) == 3
        assert sample(registry, "eoguard_producer_queue_messages", instance=instance) == 0
        assert sample(registry, "eoguard_producer_store_available", instance=instance) == 1
        p50 = sample(registry, "eoguard_producer_ack_latency_seconds", instance=instance, quantile="0.5")
        assert p50 is not None
        assert 0 < p50 < 30
    finally:
        producer.close()

    consumer = GuardedConsumer(ConsumerConfig(
        kafka={"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}-g"},
        redis=RedisConfig(url=redis_url), scope="metrics", topics=(topic,), keyspace=keys),
        handler=lambda ctx: None)
    try:
        polled = 0
        for _ in range(30):
            polled += consumer.poll_once()
            if consumer.stats().handled >= 3:
                break
        register_consumer(consumer, registry=registry)
        labels = {"scope": "metrics", "instance": consumer.instance_id}
        assert sample(registry, "eoguard_consumer_handled_total", **labels) == 3
        assert sample(registry, "eoguard_consumer_polled_total", **labels) == polled
        assert sample(registry, "eoguard_consumer_duplicates_dropped_total", **labels) == 0
        assert sample(registry, "eoguard_consumer_in_flight", **labels) == 0
        text = generate_latest(registry).decode()
        assert "# TYPE eoguard_consumer_dead_lettered_total counter" in text
    finally:
        consumer.close()


def test_outbox_metrics(redis_client, seeded) -> None:
    registry = CollectorRegistry()
    register_outbox(redis_client, seeded.keys, registry=registry)
    prefix = seeded.keys.prefix
    assert sample(registry, "eoguard_outbox_pending", prefix=prefix) == 4
    assert sample(registry, "eoguard_outbox_past_resend_time", prefix=prefix) == 0
    age = sample(registry, "eoguard_outbox_oldest_pending_age_seconds", prefix=prefix)
    assert age is not None
    assert 0 <= age < 60
