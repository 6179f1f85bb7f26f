"""Configuration, given at construction as frozen keyword-only dataclasses.

Invalid values raise :class:`eoguard.errors.ConfigError` when the object is built, never
later. Secrets (passwords, SASL credentials, TLS keys) never appear in a ``repr`` or a log.
One module a concept: where the services are (:mod:`~eoguard.config.services`), the producer's
and the consumer's settings, and the checks they share.
"""

from __future__ import annotations

from eoguard.codec.rules import InputLimits
from eoguard.config.consumer import ConsumerConfig
from eoguard.config.producer import ProducerConfig
from eoguard.config.services import RedisConfig, SchemaRegistryConfig
from eoguard.modes import Durability, KeepUntil, PersistenceMode, WireFormat
from eoguard.redaction import redact

__all__ = [
    "ConsumerConfig",
    "Durability",
    "InputLimits",
    "KeepUntil",
    "PersistenceMode",
    "ProducerConfig",
    "RedisConfig",
    "SchemaRegistryConfig",
    "WireFormat",
    "redact",
]
