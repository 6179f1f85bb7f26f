"""DeliverySink against real Kafka: produce is bounded while Kafka is down, not while it drains."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from eoguard.errors import BrokerUnavailableError, ConfigError
from eoguard.kafka.sink import DeliverySink
from eoguard.stack.kafka_broker import KafkaBroker

pytestmark = pytest.mark.integration

QUEUE = 5  # records librdkafka may hold: a tiny queue fills at once


def sink_conf(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "queue.buffering.max.messages": QUEUE,
            "message.timeout.ms": 120_000}  # far beyond the test: nothing expires meanwhile


def test_produce_gives_up_within_its_bound_while_kafka_is_down(
        private_kafka: KafkaBroker) -> None:
    sink = DeliverySink(sink_conf(private_kafka.address), produce_timeout_s=1.5)
    try:
        sink.produce("dead-letters", b"before")
        sink.flush(60)
        private_kafka.kill()
        for i in range(QUEUE):  # fill the queue: nothing can leave it now
            sink.produce("dead-letters", b"queued %d" % i)
        assert sink.pending == QUEUE
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match="stayed full"):
            sink.produce("dead-letters", b"one too many")
        waited = time.monotonic() - started
        print(f"produce gave up after {waited:.2f} s (bound 1.5 s)")
        assert 1.4 <= waited < 4.0
        assert sink.pending == QUEUE  # the refused record was not queued
        # Kafka back: what was queued before the error is delivered, nothing is lost.
        private_kafka.start()
        sink.flush(90)
        assert sink.pending == 0
    finally:
        sink.close(5)


def test_a_full_queue_that_drains_is_no_error(kafka_bootstrap: str,
                                              new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=1)
    sink = DeliverySink(sink_conf(kafka_bootstrap), produce_timeout_s=0.5)
    try:
        sink.produce(topic, b"warm-up")  # connection and metadata: slower than the bound
        sink.flush(30)
        # Records through a 5-record queue take longer than the bound in all: only a queue
        # that makes no progress at all may time out.
        started = time.monotonic()
        count = 0
        while time.monotonic() - started < 1.5:
            sink.produce(topic, b"%d" % count)
            count += 1
        sink.flush(30)
        assert sink.pending == 0
        print(f"{count} records through a {QUEUE}-record queue in "
              f"{time.monotonic() - started:.2f} s, bound 0.5 s")
    finally:
        sink.close(5)


def test_produce_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        DeliverySink({}, produce_timeout_s=0)
