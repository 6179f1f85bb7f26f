"""A broker paused past the group's session timeout under a busy static member: the
coordinator drops the member, and once the broker is back the member must rejoin and handle
everything sent before and after the pause, once.

Chaos single seed 6 found a member that never rejoined after a pause like this one, when a
Redis restart just before had left it a commit that failed UNKNOWN_MEMBER_ID
(``GuardedConsumer._when_idle``). This test does not get that commit failure on its own (it
passes with and without that fix); the seed's replay is the check of the fix.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.stack import create_topics
from eoguard.stack.feed import envelope, produce
from eoguard.stack.kafka_broker import KafkaBroker
from tests.consumer_kit import CODEC, consumer_config
from tests.integration.test_adaptive_delay import paused

pytestmark = pytest.mark.integration


def test_a_member_dropped_by_a_paused_coordinator_rejoins_and_handles_everything(
        private_kafka: KafkaBroker, redis_url: str, key_prefix: str) -> None:
    topic = f"pause-{key_prefix}"
    create_topics(private_kafka.address, {topic: 2})
    seen: list[str] = []
    group = f"g-{key_prefix}"
    config = consumer_config(private_kafka.address, redis_url, [topic], prefix=key_prefix,
                             group=group, kafka={"group.instance.id": f"{group}-0"})
    consumer = GuardedConsumer(config, handler=lambda ctx: seen.append(ctx.message_id))
    stop = threading.Event()
    runner = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    runner.start()
    sent: list[str] = []

    def send(n: int) -> None:
        envs = [envelope(b"p", ttl_ms=600_000) for _ in range(n)]
        produce(private_kafka.address, topic, [CODEC.encode(e) for e in envs])
        sent.extend(e.id for e in envs)

    try:
        for _ in range(20):  # busy: commits in flight when the broker stops
            send(50)
            time.sleep(0.05)
        with paused(private_kafka):
            time.sleep(9.0)  # past session.timeout.ms (6 s): the member is dropped
        for _ in range(20):
            send(50)
            time.sleep(0.05)
        deadline = time.monotonic() + 90
        while set(seen) < set(sent):
            assert runner.is_alive(), "the consumer's loop ended"
            assert time.monotonic() < deadline, (
                f"{len(set(sent) - set(seen))} of {len(sent)} never handled after the pause; "
                f"{consumer.stats()}")
            time.sleep(0.2)
    finally:
        stop.set()
        runner.join(30)
        consumer.close()
    twice = [i for i, n in Counter(seen).items() if n > 1]
    print(f"\n{len(sent)} sent around a 9 s broker pause, {len(set(seen))} handled, "
          f"{len(twice)} twice")
    assert not twice
