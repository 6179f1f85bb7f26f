"""Passwords from the environment or a file, so none has to sit in a URL that ``ps`` shows.

Precedence, for Redis and for Kafka alike: a value given in code or in the URL (or the Kafka
configuration) wins; then the environment variable; then the file the ``..._FILE`` variable
names (its content, without the trailing newline). Nothing here logs or echoes a value.

=================================  ===========================================================
``EOGUARD_REDIS_USERNAME``         Redis ACL user, when neither the URL nor the code names one
``EOGUARD_REDIS_PASSWORD``         Redis password, when neither the URL nor the code gives one
``EOGUARD_REDIS_PASSWORD_FILE``    a file holding it (used when the variable above is unset)
``EOGUARD_KAFKA_SASL_USERNAME``    ``sasl.username``, when ``security.protocol`` is SASL_*
``EOGUARD_KAFKA_SASL_PASSWORD``    ``sasl.password``, likewise
``EOGUARD_KAFKA_SASL_PASSWORD_FILE``  a file holding it (used when the variable above is unset)
=================================  ===========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from eoguard.errors import ConfigError

REDIS_USERNAME = "EOGUARD_REDIS_USERNAME"
REDIS_PASSWORD = "EOGUARD_REDIS_PASSWORD"  # noqa: S105 - a variable name
KAFKA_SASL_USERNAME = "EOGUARD_KAFKA_SASL_USERNAME"
KAFKA_SASL_PASSWORD = "EOGUARD_KAFKA_SASL_PASSWORD"  # noqa: S105 - a variable name

_JAAS_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def secret(variable: str) -> str | None:
    """The value of ``variable``, else the content of the file ``variable_FILE`` names,
    else None. Raises :class:`ConfigError` (naming the file, not its content) when that
    file cannot be read or is empty."""
    value = os.environ.get(variable)
    if value:
        return value
    path = os.environ.get(f"{variable}_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"{variable}_FILE: cannot read {path} ({exc.strerror})") from None
    if not text:
        raise ConfigError(f"{variable}_FILE: {path} is empty")
    return text


def redis_login(url: str, username: str | None, password: str | None) -> dict[str, str]:
    """The ``username``/``password`` options the environment adds to a Redis connection:
    nothing when ``url`` or the caller gives a password."""
    try:
        parts = urlsplit(url)
        given_user, given_password = parts.username, parts.password
    except ValueError:
        return {}  # redis-py reports the bad URL
    if password or given_password:
        return {}
    found = secret(REDIS_PASSWORD)
    if found is None:
        return {}
    login = {"password": found}
    user = os.environ.get(REDIS_USERNAME)
    if user and not (username or given_user):
        login["username"] = user
    return login


def _sasl(conf: Mapping[str, Any], prefix: str) -> bool:
    return str(conf.get(f"{prefix}security.protocol", "")).upper().startswith("SASL")


def kafka_login(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A librdkafka configuration with ``sasl.username``/``sasl.password`` filled from the
    environment where ``security.protocol`` is SASL_* and the configuration lacks them."""
    out = dict(conf)
    if not _sasl(conf, ""):
        return out
    if not out.get("sasl.password"):
        found = secret(KAFKA_SASL_PASSWORD)
        if found is not None:
            out["sasl.password"] = found
    if not out.get("sasl.username") and os.environ.get(KAFKA_SASL_USERNAME):
        out["sasl.username"] = os.environ[KAFKA_SASL_USERNAME]
    return out


def kafka_jaas_login(options: Mapping[str, str]) -> dict[str, str]:
    """Options of Spark's Kafka source with ``kafka.sasl.jaas.config`` built from the
    environment where ``kafka.security.protocol`` is SASL_*, ``kafka.sasl.mechanism`` is
    PLAIN or SCRAM and the options lack a JAAS configuration."""
    out = dict(options)
    if not _sasl(options, "kafka.") or out.get("kafka.sasl.jaas.config"):
        return out
    mechanism = str(options.get("kafka.sasl.mechanism", "GSSAPI")).upper()
    user, password = os.environ.get(KAFKA_SASL_USERNAME), secret(KAFKA_SASL_PASSWORD)
    if mechanism not in _JAAS_MODULES or not user or password is None:
        return out
    for text in (user, password):
        if '"' in text or "\\" in text:
            raise ConfigError(f"{KAFKA_SASL_USERNAME}/{KAFKA_SASL_PASSWORD}: a JAAS "
                              "configuration cannot hold '\"' or '\\'; pass "
                              "kafka.sasl.jaas.config instead")
    out["kafka.sasl.jaas.config"] = (f'{_JAAS_MODULES[mechanism]} required '
                                     f'username="{user}" password="{password}";')
    return out
