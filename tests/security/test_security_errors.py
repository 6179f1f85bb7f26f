"""A wrong password and an untrusted certificate end in eoguard's typed errors, each one
line naming what to fix and holding no secret: from the producer, the consumer, the Spark
job's start and the CLI."""

from __future__ import annotations

import gc
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

from eoguard import (
    BrokerSecurityError,
    ConsumerConfig,
    GuardedConsumer,
    GuardedProducer,
    ProducerConfig,
    RedisConfig,
    SecurityError,
    StoreSecurityError,
)
from eoguard.cli import cli
from eoguard.stack import create_topics
from eoguard.store.keys import KeySpace
from tests.security.secure_kit import SecureStack

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.security]

WRONG = f"wrong-{uuid.uuid4().hex}"


def _one_line(exc: BaseException, *secrets: str) -> str:
    text = str(exc)
    assert text, type(exc).__name__
    assert "\n" not in text, text
    assert not any(secret in text for secret in secrets), text
    return text


def _kafka(stack: SecureStack, reason: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    if reason == "credentials":
        # The variable wins over the file the environment names too (which holds the right one).
        monkeypatch.setenv("EOGUARD_KAFKA_SASL_PASSWORD", WRONG)
        return stack.kafka()
    return stack.kafka(**{"ssl.ca.location": str(stack.rogue_ca)})


def _flush_refused(config: ProducerConfig, topic: str) -> BrokerSecurityError:
    """The error a producer's ``flush`` raised. The producer is closed and collected after,
    so its librdkafka handle does not retry the login for the rest of the session."""
    producer = GuardedProducer(config)
    try:
        producer.send(topic, b"never delivered")
        producer.flush(20)
    except BrokerSecurityError as exc:
        return exc.with_traceback(None)
    finally:
        producer.close(timeout_s=0.5)
        del producer
        gc.collect()
    pytest.fail("flush returned although Kafka refused the producer")


def _poll_for(consumer: GuardedConsumer, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        consumer.poll_once()


@pytest.mark.parametrize("reason", ["credentials", "certificate"])
def test_kafka_refusal_is_a_typed_error(secure_stack: SecureStack, login_env: dict[str, str],
                                        key_prefix: str, reason: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    topic = f"refused-{uuid.uuid4().hex[:8]}"
    create_topics(secure_stack.kafka_admin, {topic: 1})
    kafka = _kafka(secure_stack, reason, monkeypatch)
    redis = RedisConfig(url=secure_stack.redis_url)
    started = time.monotonic()
    refused = _flush_refused(ProducerConfig(kafka=kafka, redis=redis,
                                            keyspace=KeySpace(prefix=key_prefix)), topic)
    produced_s = time.monotonic() - started
    assert refused.reason == reason
    text = _one_line(refused, WRONG, *secure_stack.secrets)
    assert ("SASL authentication" if reason == "credentials" else "certificate") in text

    config = ConsumerConfig(kafka={**kafka, "group.id": f"g-{uuid.uuid4().hex[:8]}"},
                            redis=redis, scope="app", topics=(topic,),
                            keyspace=KeySpace(prefix=key_prefix), poll_timeout_s=0.2)
    started = time.monotonic()
    with GuardedConsumer(config, handler=lambda _: None) as consumer, \
            pytest.raises(BrokerSecurityError) as polled:
        _poll_for(consumer, 20.0)
    assert polled.value.reason == reason
    _one_line(polled.value, WRONG, *secure_stack.secrets)
    print(f"kafka {reason}: producer flush raised after {produced_s:.1f} s, consumer poll "
          f"after {time.monotonic() - started:.1f} s: {text}")


@pytest.mark.spark
@pytest.mark.parametrize("reason", ["credentials", "certificate"])
def test_redis_refusal_is_a_typed_error(spark: SparkSession, secure_stack: SecureStack,
                                        login_env: dict[str, str], key_prefix: str,
                                        reason: str, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    from eoguard_spark import JobOptions, build_query  # noqa: PLC0415 - Spark tests only

    url = secure_stack.redis_url
    if reason == "credentials":
        monkeypatch.setenv("EOGUARD_REDIS_PASSWORD", WRONG)
    else:
        url = secure_stack.redis_url_with_ca(secure_stack.rogue_ca)
    errors: list[SecurityError] = []
    with pytest.raises(StoreSecurityError) as started:
        GuardedProducer(ProducerConfig(kafka=secure_stack.kafka(), redis=RedisConfig(url=url),
                                       keyspace=KeySpace(prefix=key_prefix)))
    errors.append(started.value)
    options = JobOptions(bootstrap=secure_stack.kafka_bootstrap, topics=("t",), scope="spark",
                         checkpoint=str(tmp_path / "cp"), output_path=str(tmp_path / "out"),
                         redis_url=url, key_prefix=key_prefix, available_now=True)
    with pytest.raises(StoreSecurityError) as job:
        build_query(spark, options)
    errors.append(job.value)
    for error in errors:
        assert error.reason == reason
        _one_line(error, WRONG, *secure_stack.secrets)

    result = CliRunner().invoke(cli, ["--redis-url", url, "--prefix", key_prefix, "status"])
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert "\n" not in line, line
    assert WRONG not in line, line
    assert ("refused authentication" if reason == "credentials" else "does not trust") in line
    print(f"redis {reason}: {errors[0]} | cli: {line}")
