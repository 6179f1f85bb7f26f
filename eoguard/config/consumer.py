"""The consumer's configuration (:class:`ConsumerConfig`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eoguard.codec.plain import PlainRecords
from eoguard.codec.rules import InputLimits
from eoguard.config.checks import check_limits, positive
from eoguard.config.services import RedisConfig, SchemaRegistryConfig, check_registry
from eoguard.errors import ConfigError
from eoguard.redaction import redact
from eoguard.store.keys import KeySpace, check_scope

log = logging.getLogger(__name__)

_FALSE = {"false", "0"}
_CONNECTION_KEYS = ("bootstrap.servers", "client.id", "security.", "sasl.", "ssl.",
                    "socket.", "broker.address.family")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerConfig:
    """Everything a :class:`eoguard.GuardedConsumer` needs, checked at construction.

    ``kafka`` passes through to librdkafka and must name ``bootstrap.servers`` and ``group.id``;
    :meth:`kafka_config` turns ``enable.auto.commit`` and ``enable.auto.offset.store`` off
    (offsets are stored only after a batch is done) and defaults ``auto.offset.reset`` to
    ``earliest``. ``scope`` is the dedup namespace: each scope handles a message once.
    Records that break ``input_limits`` or the key prefix's ``max_ttl_ms`` are malformed
    (:mod:`eoguard.codec.rules`): dead-lettered, never claimed. The clock-skew allowance is
    at most ``grace_s`` (:meth:`effective_limits`).
    Claims are renewed every ``lease_s / 3`` while their batch is handled, so ``lease_s`` only
    bounds how long a crashed consumer's claims block a duplicate; ``busy_wait_s`` bounds how long a
    batch waits on a claim another owner holds; dedup keys live until ``expires_at + grace_s``.
    The dead-letter topic defaults to ``<scope>.dead-letter``. With ``plain_records``
    (:class:`~eoguard.codec.plain.PlainRecords`) records that are not envelopes are handled
    too, their id and expiry given by its rules (docs/design.md §6, "Plain topics"); without
    it they are malformed. ``trace_messages`` > 0 keeps the stage stamps of that many messages
    last committed (:meth:`eoguard.GuardedConsumer.trace`); 0, the default, traces nothing.
    ``schema_registry`` reads the Avro payloads of records in the header wire format (writer
    schema by id); without it such records are malformed, raw-bytes ones are read anyway.
    """

    kafka: Mapping[str, Any] = field(repr=False)
    redis: RedisConfig
    scope: str
    topics: tuple[str, ...]
    batch_size: int = 500
    poll_timeout_s: float = 1.0
    lease_s: float = 30.0
    grace_s: float = 300.0
    max_retries: int = 3
    retry_backoff_s: float = 0.2
    retry_backoff_max_s: float = 5.0
    busy_wait_s: float = 30.0
    dead_letter_topic: str | None = None
    expired_to_dead_letter: bool = False
    ack_outbox: bool = True
    keyspace: KeySpace = field(default_factory=KeySpace)
    input_limits: InputLimits = field(default_factory=InputLimits)
    instance_id: str | None = None
    plain_records: PlainRecords | None = None
    trace_messages: int = 0
    schema_registry: SchemaRegistryConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kafka, Mapping) or not self.kafka.get("bootstrap.servers"):
            raise ConfigError("kafka config must be a mapping with 'bootstrap.servers'")
        if not self.kafka.get("group.id"):
            raise ConfigError("kafka config must name the consumer group ('group.id')")
        object.__setattr__(self, "kafka", dict(self.kafka))
        if not isinstance(self.redis, RedisConfig):
            raise ConfigError("redis must be a RedisConfig")
        check_scope(self.scope)
        if isinstance(self.topics, str) or not self.topics or not all(self.topics):
            raise ConfigError("topics must be a non-empty sequence of topic names")
        object.__setattr__(self, "topics", tuple(self.topics))
        for name in ("batch_size", "poll_timeout_s", "lease_s", "grace_s", "retry_backoff_s",
                     "retry_backoff_max_s", "busy_wait_s"):
            positive(name, getattr(self, name))
        for name in ("max_retries", "trace_messages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
        max_poll_s = self.max_poll_interval_s
        if self.busy_wait_s + self.lease_s >= max_poll_s:
            raise ConfigError(f"busy_wait_s + lease_s ({self.busy_wait_s + self.lease_s} s) must "
                              f"stay below max.poll.interval.ms ({max_poll_s} s)")
        if self.dead_letter_topic is not None and not self.dead_letter_topic:
            raise ConfigError("dead_letter_topic must be non-empty when given")
        check_limits(self.keyspace, self.input_limits)
        if self.instance_id is not None and not self.instance_id:
            raise ConfigError("instance_id must be non-empty when given")
        check_registry(self.schema_registry)
        if self.plain_records is not None:
            if not isinstance(self.plain_records, PlainRecords):
                raise ConfigError("plain_records must be a PlainRecords")
            self.plain_records.check(max_ttl_ms=self.keyspace.max_ttl_ms)

    def effective_limits(self) -> InputLimits:
        """``input_limits`` with the clock-skew allowance capped at ``grace_s``: a claim key
        lives at most until now + max_ttl + grace, so an expiry accepted beyond that would
        outlive its key."""
        return self.input_limits.within_grace(int(self.grace_s * 1000))

    @property
    def max_poll_interval_s(self) -> float:
        """librdkafka's ``max.poll.interval.ms``: past it the group evicts a stalled consumer,
        so claims are not renewed for longer than that either."""
        return int(self.kafka.get("max.poll.interval.ms", 300_000)) / 1000

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__
                          if name != "kafka")
        return f"ConsumerConfig(kafka={redact(self.kafka)!r}, {shown})"

    @property
    def dead_letter(self) -> str:
        """The dead-letter topic in effect."""
        return self.dead_letter_topic or f"{self.scope}.dead-letter"

    def kafka_config(self) -> dict[str, Any]:
        """The librdkafka consumer dict: offsets stored and committed by eoguard only.

        A user value that differs is overridden with a warning naming the setting.
        """
        conf = dict(self.kafka)
        for key in ("enable.auto.commit", "enable.auto.offset.store"):
            value = conf.get(key)
            if value is not None and str(value).lower() not in _FALSE:
                log.warning("eoguard forces %s=false (the configuration had %r): offsets are "
                            "committed only after a batch is done", key, value)
            conf[key] = False
        conf.setdefault("auto.offset.reset", "earliest")
        return conf

    def producer_kafka_config(self) -> dict[str, Any]:
        """The librdkafka producer dict for dead letters and read-process-write outputs.

        The connection and security settings of ``kafka``, with ``acks=all`` and idempotence.
        """
        conf = {k: v for k, v in self.kafka.items() if k.startswith(_CONNECTION_KEYS)}
        conf.update({"acks": "all", "enable.idempotence": True, "linger.ms": 5})
        return conf
