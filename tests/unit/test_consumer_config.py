"""ConsumerConfig: validation at construction, the rendered librdkafka dict, secrets out of repr."""

from __future__ import annotations

import logging

import pytest

from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.errors import ConfigError

KAFKA = {"bootstrap.servers": "k:9092", "group.id": "g"}


def config(**kw) -> ConsumerConfig:
    values = {"kafka": KAFKA, "redis": RedisConfig(url="redis://r:6379/0"), "scope": "billing",
              "topics": ("orders",), **kw}
    return ConsumerConfig(**values)


def test_offsets_are_never_committed_by_librdkafka(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        conf = config(kafka={**KAFKA, "enable.auto.commit": True}).kafka_config()
    assert conf["enable.auto.commit"] is False
    assert conf["enable.auto.offset.store"] is False
    assert conf["auto.offset.reset"] == "earliest"
    assert "enable.auto.commit=false" in caplog.text


def test_user_settings_pass_through() -> None:
    conf = config(kafka={**KAFKA, "auto.offset.reset": "latest", "fetch.min.bytes": 10}).kafka_config()
    assert conf["auto.offset.reset"] == "latest"
    assert conf["fetch.min.bytes"] == 10
    producer = config(kafka={**KAFKA, "security.protocol": "SSL"}).producer_kafka_config()
    assert producer["security.protocol"] == "SSL"
    assert "group.id" not in producer
    assert producer["acks"] == "all"


def test_secrets_stay_out_of_repr() -> None:
    text = repr(config(kafka={**KAFKA, "sasl.password": "hunter2"},
                       redis=RedisConfig(url="redis://u:topsecret@r:6379/0")))
    assert "hunter2" not in text
    assert "topsecret" not in text
    assert "billing" in text


@pytest.mark.parametrize("bad", [
    {"kafka": {"bootstrap.servers": "k:9092"}},  # no group.id
    {"scope": ""},
    {"scope": "a|b"},
    {"topics": ()},
    {"topics": "orders"},
    {"batch_size": 0},
    {"max_retries": -1},
    {"trace_messages": -1},
    {"trace_messages": True},
    {"lease_s": 200.0, "busy_wait_s": 200.0},  # beyond max.poll.interval.ms
])
def test_invalid_values_fail_at_construction(bad) -> None:
    with pytest.raises(ConfigError):
        config(**bad)


def test_dead_letter_topic_defaults_to_the_scope() -> None:
    assert config().dead_letter == "billing.dead-letter"
    assert config(dead_letter_topic="dlq").dead_letter == "dlq"
