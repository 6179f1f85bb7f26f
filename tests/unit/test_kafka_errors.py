"""How librdkafka's errors map to eoguard's: a fatal one is never retried as if transient."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from eoguard.errors import BrokerUnavailableError, ConsumerFencedError
from eoguard.kafka.consumer import _is_fatal, _wrap


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
