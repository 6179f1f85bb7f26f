"""Logins from the environment or a file: the precedence docs/security.md states, and no value in
an error message."""

from __future__ import annotations

from pathlib import Path

import pytest

from eoguard.credentials import kafka_jaas_login, kafka_login, redis_login, secret
from eoguard.errors import ConfigError

SASL = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EOGUARD_REDIS_USERNAME", "EOGUARD_REDIS_PASSWORD", "EOGUARD_REDIS_PASSWORD_FILE",
                 "EOGUARD_KAFKA_SASL_USERNAME", "EOGUARD_KAFKA_SASL_PASSWORD",
                 "EOGUARD_KAFKA_SASL_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_variable_wins_over_file_and_file_loses_its_newline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pw"
    path.write_text("from-file\n")
    monkeypatch.setenv("EOGUARD_REDIS_PASSWORD_FILE", str(path))
    assert secret("EOGUARD_REDIS_PASSWORD") == "from-file"
    monkeypatch.setenv("EOGUARD_REDIS_PASSWORD", "from-env")
    assert secret("EOGUARD_REDIS_PASSWORD") == "from-env"


@pytest.mark.parametrize("content", [None, ""])
def test_a_missing_or_empty_file_names_the_file(tmp_path: Path, content: str | None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pw"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_PASSWORD_FILE", str(path))
    with pytest.raises(ConfigError, match="EOGUARD_KAFKA_SASL_PASSWORD_FILE") as exc:
        secret("EOGUARD_KAFKA_SASL_PASSWORD")
    assert str(path) in str(exc.value)


def test_redis_login_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "rediss://127.0.0.1:6380/0"
    assert redis_login(url, None, None) == {}  # nothing set: redis-py's defaults
    monkeypatch.setenv("EOGUARD_REDIS_PASSWORD", "env-pw")
    monkeypatch.setenv("EOGUARD_REDIS_USERNAME", "env-user")
    assert redis_login(url, None, None) == {"password": "env-pw", "username": "env-user"}
    assert redis_login(url, "code-user", None) == {"password": "env-pw"}
    assert redis_login("rediss://url-user@127.0.0.1:6380/0", None, None) == {"password": "env-pw"}
    assert redis_login(url, None, "code-pw") == {}  # the code's password wins
    assert redis_login("rediss://u:url-pw@127.0.0.1:6380/0", None, None) == {}  # the URL's wins


def test_kafka_login_fills_only_sasl_and_only_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_PASSWORD", "env-pw")
    assert kafka_login(SASL) == {**SASL, "sasl.username": "env-user", "sasl.password": "env-pw"}
    given = {**SASL, "sasl.username": "u", "sasl.password": "p"}
    assert kafka_login(given) == given
    plain = {"bootstrap.servers": "b:9092", "security.protocol": "SSL"}
    assert kafka_login(plain) == plain


def test_spark_jaas_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    options = {f"kafka.{k}": v for k, v in SASL.items()}
    assert kafka_jaas_login(options) == options  # no login in the environment
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_PASSWORD", "env-pw")
    jaas = kafka_jaas_login(options)["kafka.sasl.jaas.config"]
    assert jaas == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                    'username="env-user" password="env-pw";')
    own = {**options, "kafka.sasl.jaas.config": "theirs"}
    assert kafka_jaas_login(own) == own
    monkeypatch.setenv("EOGUARD_KAFKA_SASL_PASSWORD", 'a"quote')
    with pytest.raises(ConfigError) as exc:
        kafka_jaas_login(options)
    assert "quote" not in str(exc.value)
