"""A delivery Kafka reports failed is resent by its own producer at its next recovery pass,
not ``resend_after`` later: librdkafka retries nothing after that report, so a short-TTL
message need not expire waiting (docs/design.md §5). Real broker, paused with SIGSTOP past
``message.timeout.ms``."""

from __future__ import annotations

import time

import pytest

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import create_topics
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.store.keys import KeySpace
from tests.integration.test_adaptive_delay import paused
from tests.integration.test_producer import consume

pytestmark = pytest.mark.integration

RESEND_AFTER_S = 300.0  # far beyond the test: only the prompt path can resend in time


@pytest.mark.parametrize("mode", ["persist-first", "delayed"])
def test_failed_deliveries_are_resent_at_the_next_recovery_pass(
        mode: str, private_kafka: KafkaBroker, redis_url: str, key_prefix: str) -> None:
    topic = f"failed-resend-{key_prefix}"
    create_topics(private_kafka.address, {topic: 1})
    config = ProducerConfig(
        kafka={"bootstrap.servers": private_kafka.address, "linger.ms": 5,
               "message.timeout.ms": 3_000},
        redis=RedisConfig(url=redis_url), mode=mode, keyspace=KeySpace(prefix=key_prefix),
        default_ttl_s=600, resend_after_s=RESEND_AFTER_S, recover_interval_s=1.0,
        delay_min_ms=1, delay_max_ms=50)
    with GuardedProducer(config) as producer:
        first = producer.send(topic, b"before")
        assert producer.flush(30) == 0
        with paused(private_kafka):
            handles = [producer.send(topic, b"m%d" % i) for i in range(20)]
            deadline = time.monotonic() + 30
            while producer.stats().delivery_failures < len(handles):
                assert time.monotonic() < deadline, f"{producer.stats()}"
                time.sleep(0.1)
            failed_at = time.monotonic()
        # The paused broker may still write the first copies once resumed; the resends are
        # the copies with attempt 2 (a consumer's dedup keeps one).
        got = consume(private_kafka.address, topic, 1 + 2 * len(handles), timeout_s=60)
        took = time.monotonic() - failed_at
        stats = producer.stats()
    ids = {env.id for _, env in got}
    resent = {env.id for _, env in got if env.attempt >= 2}
    print(f"\n{mode}: {stats.delivery_failures} deliveries failed, {stats.resent} resent, all "
          f"{len(handles)} on the topic {took:.1f} s after the broker resumed")
    assert {first.id, *(h.id for h in handles)} <= ids
    assert {h.id for h in handles} <= resent
    assert stats.resent >= len(handles)
    assert took < RESEND_AFTER_S / 5
