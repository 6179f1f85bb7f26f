"""Spark's redaction settings of the job (eoguard_spark.redaction) cover what eoguard passes
and leave plain settings readable; the Kafka source gets its JAAS login from the
environment."""

from __future__ import annotations

import re

import pytest

from eoguard_spark import JobOptions
from eoguard_spark.redaction import REDACTION_REGEX, STRING_REDACTION_REGEX


@pytest.mark.parametrize(("key", "value"), [
    ("kafka.sasl.jaas.config", 'org.apache.kafka.common.security.scram.ScramLoginModule '
                               'required username="u" password="p";'),
    ("spark.eoguard.redis", "rediss://user:pw@redis.example:6380/0"),
    ("kafka.ssl.keystore.key", "-----BEGIN PRIVATE KEY-----"),
    ("kafka.ssl.truststore.password", "x"),
])
def test_spark_redaction_covers_what_eoguard_passes(key: str, value: str) -> None:
    # Spark redacts a pair when the regex finds a match in its key or in its value.
    assert re.search(REDACTION_REGEX, key) or re.search(REDACTION_REGEX, value), key


@pytest.mark.parametrize("key", ["kafka.bootstrap.servers", "spark.app.name", "subscribe",
                                 "kafka.security.protocol", "startingOffsets"])
def test_spark_redaction_leaves_plain_settings(key: str) -> None:
    assert not re.search(REDACTION_REGEX, key)


def test_spark_string_redaction_cuts_the_password_out_of_plan_text() -> None:
    text = 'ScramLoginModule required username="u" password="s3cr3t"; rediss://u:pw@h:6380/0'
    redacted = re.sub(STRING_REDACTION_REGEX, "*********(redacted)", text)
    assert "s3cr3t" not in redacted
    assert ":pw@" not in redacted
    assert 'username="u"' in redacted


def test_source_options_take_the_jaas_login_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_PASSWORD", "env-pw")
    options = JobOptions(bootstrap="k:9093", topics=("t",), scope="app", checkpoint="/tmp/cp",
                         output_path="/tmp/out",
                         kafka_options={"kafka.security.protocol": "SASL_SSL",
                                        "kafka.sasl.mechanism": "SCRAM-SHA-512"})
    assert 'password="env-pw"' in options.source_options()["kafka.sasl.jaas.config"]
    assert "env-pw" not in repr(options)
    assert "env-pw" not in str(options.describe())
