"""Producer -> consumer -> Spark job -> CLI over Kafka SASL_SSL (SCRAM) and Redis TLS + ACL,
with every login taken from the environment or a file; then no password anywhere in what
they printed, logged (Spark's log at INFO included) or showed in a repr."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from eoguard import ConsumerConfig, GuardedConsumer, GuardedProducer, ProducerConfig, RedisConfig
from eoguard.stack import create_topics
from eoguard.store.keys import KeySpace
from tests.consumer_kit import drain
from tests.security.secure_kit import SecureStack
from tests.security.spark_log import spark_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.security]

ROOT = Path(__file__).resolve().parents[2]
COUNT = 20


def _produce(stack: SecureStack, topic: str, prefix: str) -> tuple[set[str], str]:
    config = ProducerConfig(kafka=stack.kafka(), redis=RedisConfig(url=stack.redis_url),
                            keyspace=KeySpace(prefix=prefix))
    guaranteed: list[str] = []
    with GuardedProducer(config, on_guaranteed=lambda h: guaranteed.append(h.id)) as producer:
        sent = {producer.send(topic, f"order-{i}".encode(), key=str(i)).id
                for i in range(COUNT)}
        assert producer.flush(60) == 0
    assert set(guaranteed) == sent
    return sent, repr(config)


def _consume(stack: SecureStack, topic: str, prefix: str) -> tuple[list[str], str]:
    config = ConsumerConfig(
        kafka=stack.kafka(**{"group.id": f"g-{uuid.uuid4().hex[:8]}"}),
        redis=RedisConfig(url=stack.redis_url), scope="app", topics=(topic,),
        keyspace=KeySpace(prefix=prefix), poll_timeout_s=0.2)
    seen: list[str] = []
    with GuardedConsumer(config, handler=lambda ctx: seen.append(ctx.message_id)) as consumer:
        drain([consumer], lambda: len(seen) >= COUNT, timeout_s=60)
    return seen, repr(config)


def _spark_job(spark: SparkSession, stack: SecureStack, topic: str, prefix: str,
               tmp_path: Path) -> tuple[int, list[str]]:
    from eoguard_spark import JobOptions, build_query, wait_for_acks  # noqa: PLC0415
    from eoguard_spark.worker import ClaimSettings  # noqa: PLC0415

    options = JobOptions(
        bootstrap=stack.kafka_bootstrap, topics=(topic,), scope="spark",
        checkpoint=str(tmp_path / "cp"), output_path=str(tmp_path / "out"),
        dead_letter_path=str(tmp_path / "dead"), redis_url=stack.redis_url, key_prefix=prefix,
        available_now=True, lease_s=60.0, grace_s=60.0, busy_wait_s=2.0,
        kafka_options={"kafka.security.protocol": "SASL_SSL",
                       "kafka.sasl.mechanism": "SCRAM-SHA-512",
                       "kafka.ssl.truststore.type": "PEM",
                       "kafka.ssl.truststore.location": str(stack.ca)})
    # The login reached the source options and the tasks' settings (the greps check it
    # reaches no output).
    assert stack.kafka_password in options.source_options()["kafka.sasl.jaas.config"]
    assert ClaimSettings.of(options).login["password"] == stack.redis_password
    query = build_query(spark, options)
    try:
        assert query.awaitTermination(240), "the Spark job did not finish within 240 s"
        wait_for_acks(query, 60)  # its tasks log in to Redis too: inside the greps' window
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    shown = [repr(options), json.dumps(options.describe(), default=str),
             repr(ClaimSettings.of(options)), str(query.lastProgress),
             str(spark.sparkContext.getConf().getAll())]
    shown.append(query._jsq.explainInternal(True))  # type: ignore[attr-defined]  # the plans
    written = spark.read.parquet(str(tmp_path / "out")).count()
    return written, shown


def _cli_status(stack: SecureStack, prefix: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``eoguard status`` in its own process: the URL on its command line holds no password
    (what ``ps`` shows), the login comes from the environment."""
    argv = [sys.executable, "-c", "from eoguard.cli import main; main()",
            "--redis-url", stack.redis_url, "--prefix", prefix, "--json", "status",
            "--scope", "app"]
    assert not any(secret in arg for arg in argv for secret in stack.secrets)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_pipeline_over_sasl_ssl_and_redis_tls(
        spark: SparkSession, secure_stack: SecureStack, login_env: dict[str, str],
        key_prefix: str, tmp_path: Path, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="eoguard")
    caplog.set_level(logging.DEBUG, logger="eoguard_spark")
    topic = f"secure-{uuid.uuid4().hex[:8]}"
    create_topics(secure_stack.kafka_admin, {topic: 2})

    took = [time.monotonic()]
    sent, producer_repr = _produce(secure_stack, topic, key_prefix)
    took.append(time.monotonic())
    seen, consumer_repr = _consume(secure_stack, topic, key_prefix)
    took.append(time.monotonic())
    assert sorted(seen) == sorted(sent)
    with spark_log(spark, tmp_path / "spark.log") as spark_log_path:
        written, spark_shown = _spark_job(spark, secure_stack, topic, key_prefix,
                                          tmp_path / "job")
    took.append(time.monotonic())
    assert written == COUNT
    status = _cli_status(secure_stack, key_prefix, login_env)
    took.append(time.monotonic())
    assert status.returncode == 0, status.stderr
    counts = json.loads(status.stdout)
    assert counts["dedup"]["claim_keys"] == COUNT, counts["dedup"]

    out, err = capfd.readouterr()
    spark_text = spark_log_path.read_text()
    assert "sasl.jaas.config" in spark_text  # Kafka's client config was logged (hidden)
    texts = {"stdout": out, "stderr": err, "log records": caplog.text,
             "spark log": spark_text, "cli": status.stdout + status.stderr,
             "reprs": "\n".join([producer_repr, consumer_repr, *spark_shown]),
             **{str(path): path.read_text() for path in secure_stack.logs}}
    grepped = ", ".join(f"{name} ({len(text)} chars)" for name, text in texts.items())
    phases = " / ".join(f"{b - a:.1f}" for a, b in itertools.pairwise(took))
    print(f"secure pipeline: {len(sent)} sent, {len(seen)} consumed, {written} written by "
          f"Spark (producer / consumer / Spark job / CLI: {phases} s); grepped {grepped}")
    leaks = [name for name, text in texts.items()
             for secret in secure_stack.secrets if secret in text]
    assert not leaks, f"a password appears in {leaks}"

