"""How librdkafka's errors map to eoguard's: a fatal one is never retried as if transient."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eoguard.errors import BrokerUnavailableError, ConsumerFencedError
from eoguard.kafka.consumer import KafkaConsumer, _is_fatal, _wrap


def test_a_fatal_error_event_is_fatal_though_its_fatal_flag_is_not_set() -> None:
    event = KafkaError(KafkaError._FATAL)  # as consume() hands it over after a fencing
    assert not event.fatal()
    assert _is_fatal(event)
    assert _is_fatal(KafkaError(KafkaError.FENCED_INSTANCE_ID))
    assert not _is_fatal(KafkaError(KafkaError._TRANSPORT))


def test_a_fatal_failure_is_a_fenced_consumer_and_an_outage_stays_retryable() -> None:
    fatal = _wrap(KafkaException(KafkaError(KafkaError._FATAL)), "committing offsets")
    assert isinstance(fatal, ConsumerFencedError)
    down = _wrap(KafkaException(KafkaError(KafkaError._TRANSPORT)), "committing offsets")
    assert isinstance(down, BrokerUnavailableError)


def test_a_failed_asynchronous_commit_is_reported_once_and_the_users_hook_still_runs() -> None:
    # librdkafka does not retry an asynchronous commit refused during a rebalance: the
    # consumer learns of it here and commits again when idle (no broker needed to build one).
    seen: list[object] = []
    consumer = KafkaConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g",
                              "on_commit": lambda err, parts: seen.append(err)})
    try:
        assert not consumer.take_commit_failure()
        consumer._on_commit(KafkaError(KafkaError._NO_OFFSET), [])  # nothing new to commit
        assert not consumer.take_commit_failure()
        refused = KafkaError(KafkaError.ILLEGAL_GENERATION)
        consumer._on_commit(refused, [TopicPartition("t", 0, 5)])
        assert consumer.take_commit_failure()
        assert not consumer.take_commit_failure()  # taken: reported once
        # One partition refused (TopicPartition.error is read-only: a stand-in with its fields).
        part = SimpleNamespace(topic="t", partition=1, offset=7,
                               error=KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
        consumer._on_commit(None, [TopicPartition("t", 0, 5), part])  # type: ignore[list-item]
        assert consumer.take_commit_failure()
        assert len(seen) == 3
        assert seen[1] is refused
    finally:
        consumer.close()
