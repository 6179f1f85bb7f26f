"""The producer's configuration (:class:`ProducerConfig`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eoguard.codec.rules import InputLimits
from eoguard.config.checks import check_limits, positive
from eoguard.config.services import RedisConfig, SchemaRegistryConfig, check_registry
from eoguard.errors import ConfigError
from eoguard.modes import KeepUntil, PersistenceMode, WireFormat
from eoguard.redaction import redact
from eoguard.store.keys import KeySpace

log = logging.getLogger(__name__)

LIBRDKAFKA_MESSAGE_TIMEOUT_MS = 300_000
"""librdkafka's default ``message.timeout.ms`` (alias ``delivery.timeout.ms``)."""

_ACKS_ALL = {"all", "-1"}
_TRUE = {"true", "1"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerConfig:
    """Everything a :class:`eoguard.GuardedProducer` needs, checked at construction.

    ``kafka`` passes through to librdkafka (bootstrap, TLS/SASL, linger, batch size);
    :meth:`kafka_config` forces ``acks=all`` and ``enable.idempotence=true``.
    ``resend_after_s`` (default: ``message.timeout.ms`` + 15 s) is how long a record may stay
    unacknowledged before another producer may resend it; it must exceed librdkafka's own
    delivery timeout, so a resend never races librdkafka's retries of a live producer.
    ``default_ttl_s`` and every ``send``'s TTL stay within the key prefix's ``max_ttl_ms``
    (:class:`KeySpace`), and headers and payloads within ``input_limits`` (set them as your
    consumers do): a consumer refuses what lies beyond, so ``send`` refuses it first.
    ``wire_format`` (:class:`WireFormat`) is how records are written: the envelope (default)
    or the header format, whose Avro payloads need ``schema_registry`` and whose ``ce_source``
    header is ``event_source`` unless a send gives its own (docs/design.md §3).
    """

    kafka: Mapping[str, Any] = field(repr=False)
    redis: RedisConfig
    mode: PersistenceMode = PersistenceMode.PERSIST_FIRST
    keep_until: KeepUntil = KeepUntil.CONSUMED
    default_ttl_s: float = 86_400.0
    max_message_bytes: int = 1_000_000
    max_queue_messages: int = 100_000
    max_queue_bytes: int = 64 * 1024 * 1024
    send_timeout_s: float = 5.0
    delay_min_ms: int = 20
    delay_max_ms: int = 1_000
    lease_s: float = 10.0
    resend_after_s: float | None = None
    recover_interval_s: float = 5.0
    recover_on_start: bool = True
    batch_max_messages: int = 1_000
    keyspace: KeySpace = field(default_factory=KeySpace)
    input_limits: InputLimits = field(default_factory=InputLimits)
    instance_id: str | None = None
    wire_format: WireFormat = WireFormat.ENVELOPE
    schema_registry: SchemaRegistryConfig | None = None
    event_source: str = "/eoguard"

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", PersistenceMode(self.mode))
            object.__setattr__(self, "keep_until", KeepUntil(self.keep_until))
            object.__setattr__(self, "wire_format", WireFormat(self.wire_format))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        check_registry(self.schema_registry, event_source=self.event_source)
        if not isinstance(self.kafka, Mapping) or not self.kafka.get("bootstrap.servers"):
            raise ConfigError("kafka config must be a mapping with 'bootstrap.servers'")
        object.__setattr__(self, "kafka", dict(self.kafka))
        if not isinstance(self.redis, RedisConfig):
            raise ConfigError("redis must be a RedisConfig")
        for name in ("default_ttl_s", "max_message_bytes", "max_queue_messages",
                     "max_queue_bytes", "send_timeout_s", "lease_s", "recover_interval_s",
                     "batch_max_messages"):
            positive(name, getattr(self, name))
        if not 0 < self.delay_min_ms <= self.delay_max_ms:
            raise ConfigError(f"need 0 < delay_min_ms <= delay_max_ms, "
                              f"got {self.delay_min_ms} and {self.delay_max_ms}")
        if self.max_message_bytes > self.max_queue_bytes:
            raise ConfigError("max_message_bytes must not exceed max_queue_bytes")
        timeout_ms = self.message_timeout_ms
        if self.resend_after_s is not None:
            positive("resend_after_s", self.resend_after_s)
            if self.resend_after_s * 1000 <= timeout_ms:
                raise ConfigError(
                    f"resend_after_s ({self.resend_after_s}) must exceed librdkafka's "
                    f"message.timeout.ms ({timeout_ms} ms): a live producer is still retrying"
                )
        if self.lease_s < 0.3:
            raise ConfigError("lease_s must be at least 0.3 s (heartbeats run every lease_s/3)")
        check_limits(self.keyspace, self.input_limits)
        if self.default_ttl_s * 1000 > self.keyspace.max_ttl_ms:
            raise ConfigError(f"default_ttl_s ({self.default_ttl_s}) exceeds the key prefix's "
                              f"max_ttl_ms ({self.keyspace.max_ttl_ms})")
        if self.instance_id is not None and not self.instance_id:
            raise ConfigError("instance_id must be non-empty when given")
        if self.instance_id is not None and len(self.instance_id) > \
                self.input_limits.producer_chars:
            raise ConfigError(f"instance_id is over {self.input_limits.producer_chars} "
                              "characters (input_limits.producer_chars)")

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__
                          if name != "kafka")
        return f"ProducerConfig(kafka={redact(self.kafka)!r}, {shown})"

    @property
    def message_timeout_ms(self) -> int:
        """librdkafka's delivery timeout in effect (``message.timeout.ms``)."""
        value = self.kafka.get("message.timeout.ms", self.kafka.get("delivery.timeout.ms"))
        if value is None:
            return LIBRDKAFKA_MESSAGE_TIMEOUT_MS
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"message.timeout.ms must be an integer, got {value!r}") from exc

    @property
    def resend_after_ms(self) -> int:
        """Delivery timeout after which a pending record is due for resend."""
        if self.resend_after_s is not None:
            return int(self.resend_after_s * 1000)
        return self.message_timeout_ms + 15_000

    def kafka_config(self) -> dict[str, Any]:
        """The librdkafka dict: the user's settings with ``acks=all`` and idempotence forced.

        A user value that differs is overridden with a warning naming the setting and the
        value (never a secret: only these two keys are logged).
        """
        conf = dict(self.kafka)
        acks = conf.pop("acks", conf.pop("request.required.acks", None))
        if acks is not None and str(acks).lower() not in _ACKS_ALL:
            log.warning("eoguard forces acks=all (the configuration had acks=%r)", acks)
        idem = conf.get("enable.idempotence")
        if idem is not None and str(idem).lower() not in _TRUE:
            log.warning("eoguard forces enable.idempotence=true (the configuration had %r)", idem)
        conf["acks"] = "all"
        conf["enable.idempotence"] = True
        return conf


# --- Consumer ----------------------------------------------------------------------------
