"""The checks every configuration class shares: a clear ConfigError at construction."""

from __future__ import annotations

from eoguard.codec.rules import InputLimits
from eoguard.errors import ConfigError
from eoguard.redaction import redact_url
from eoguard.store.keys import KeySpace


def redacted_url(url: str | None) -> str | None:
    """``url`` with any password masked, for messages and ``repr``."""
    return None if url is None else redact_url(url)


def positive(name: str, value: float) -> None:
    """``value`` is a number above zero (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def check_limits(keyspace: object, limits: object) -> None:
    """The key space and the input limits are of their types (frozen fields, no coercion)."""
    if not isinstance(keyspace, KeySpace):
        raise ConfigError("keyspace must be a KeySpace")
    if not isinstance(limits, InputLimits):
        raise ConfigError("input_limits must be an InputLimits")
