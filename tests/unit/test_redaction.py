"""Secrets never reach a log line, a repr or an error message."""

from __future__ import annotations

import pytest

from eoguard.config import RedisConfig
from eoguard.errors import ConfigError
from eoguard.redaction import redact, redact_url, scrub


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://app:hunter2@db:6379/0", "redis://app:***@db:6379/0"),
    ("redis://app:hunter/2@db:6379/0", "redis://app:***@db:6379/0"),
    ("rediss://:p@ss@w0rd@db:6380", "rediss://:***@db:6380"),
    ("redis://db:6379/0?password=hunter2&db=1", "redis://db:6379/0?password=***&db=1"),
    ("redis://db:6379/0?ssl_keyfile=k&x_token=t", "redis://db:6379/0?ssl_keyfile=k&x_token=***"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("unix:///tmp/redis.sock?password=hunter2", "unix:///tmp/redis.sock?password=***"),
])
def test_urls_lose_their_passwords(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "hunter" not in redact_url(url)


def test_librdkafka_secrets_are_masked() -> None:
    conf = {"bootstrap.servers": "b:9092", "sasl.password": "hunter2", "ssl.key.password": "k",
            "sasl.username": "svc", "security.protocol": "SASL_SSL"}
    shown = redact(conf)
    assert shown["bootstrap.servers"] == "b:9092"
    assert shown["security.protocol"] == "SASL_SSL"
    assert {shown["sasl.password"], shown["ssl.key.password"], shown["sasl.username"]} == {"***"}


def test_redis_config_repr_and_errors_hide_the_password() -> None:
    config = RedisConfig(url="redis://app:hunter/2@db:6379/0")
    assert "hunter" not in repr(config)
    with pytest.raises(ConfigError) as caught:
        config.connect()
    assert "hunter" not in str(caught.value)


def test_scrub_replaces_secret_values_quoted_in_an_error() -> None:
    conf = {"sasl.password": "pw-123", "security.protocol": "pw-123", "client.id": "app"}
    text = 'Invalid value "pw-123" for configuration property "security.protocol" (app)'
    assert scrub(text, conf) == ('Invalid value "***" for configuration property '
                                 '"security.protocol" (app)')
