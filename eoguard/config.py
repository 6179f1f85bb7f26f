"""Configuration, given at construction as frozen keyword-only dataclasses.

Invalid values raise :class:`eoguard.errors.ConfigError` when the object is built, never
later. Secrets (passwords, SASL credentials, TLS keys) never appear in a ``repr`` or a log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eoguard.codec.plain import PlainRecords
from eoguard.codec.registry_payloads import RegistryPayloads
from eoguard.codec.rules import InputLimits
from eoguard.codec.schemas import SchemaRegistry
from eoguard.errors import ConfigError
from eoguard.modes import Durability, KeepUntil, PersistenceMode, WireFormat
from eoguard.redaction import redact, redact_url
from eoguard.store.client import RedisClient, connect
from eoguard.store.keys import KeySpace, check_scope
from eoguard.store.replicas import ReplicaWait

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

log = logging.getLogger(__name__)


LIBRDKAFKA_MESSAGE_TIMEOUT_MS = 300_000
"""librdkafka's default ``message.timeout.ms`` (alias ``delivery.timeout.ms``)."""


def _redact_url(url: str | None) -> str | None:
    return None if url is None else redact_url(url)


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def _check_limits(keyspace: object, limits: object) -> None:
    """The key space and the input limits are of their types (frozen fields, no coercion)."""
    if not isinstance(keyspace, KeySpace):
        raise ConfigError("keyspace must be a KeySpace")
    if not isinstance(limits, InputLimits):
        raise ConfigError("input_limits must be an InputLimits")


# --- Redis -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisConfig:
    """Where the outbox and the dedup keys live: a URL, or a client the application built.

    ``username``/``password`` (Redis ACL) and ``options`` (``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs``, ``retry``, ...) go straight to redis-py. Use a
    ``rediss://`` URL for TLS. An injected client must use ``decode_responses=False``.
    The same URL serves a single node and a Redis Cluster (any node of it): ``cluster=None``
    asks the server which it is; True or False says so where the server may not be asked.
    ``durability=Durability.REPLICATED`` (or the string ``"replicated"``) waits (WAIT) until a
    replica holds each round trip's writes, up to ``replica_timeout_s``, before a guarantee or
    an offset commit rests on them; it is refused at start where a master has no replica
    (docs/design.md §4). The default, ``Durability.LOCAL``, trusts the node's AOF alone.
    """

    url: str | None = None
    client: RedisClient | None = field(default=None, repr=False, compare=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    socket_timeout_s: float = 5.0
    connect_timeout_s: float = 2.0
    cluster: bool | None = None
    durability: Durability = Durability.LOCAL
    replica_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "durability", Durability(self.durability))
        except ValueError:
            raise ConfigError(f"durability must be 'local' or 'replicated' (a Durability), "
                              f"got {self.durability!r}") from None
        _positive("replica_timeout_s", self.replica_timeout_s)
        if (self.url is None) == (self.client is None):
            raise ConfigError("RedisConfig needs exactly one of url= or client=")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"Redis url must start with redis://, rediss:// or unix://, "
                              f"got {_redact_url(self.url)!r}")
        _positive("socket_timeout_s", self.socket_timeout_s)
        _positive("connect_timeout_s", self.connect_timeout_s)
        if self.client is not None:
            kwargs: Mapping[str, Any] = getattr(self.client, "get_connection_kwargs", dict)()
            if kwargs.get("decode_responses"):
                raise ConfigError("the injected Redis client must use decode_responses=False")

    def __repr__(self) -> str:
        target = "client=<injected>" if self.client is not None else f"url={_redact_url(self.url)!r}"
        return (f"RedisConfig({target}, username={self.username!r}, "
                f"password={'***' if self.password else None}, options={redact(self.options)!r}, "
                f"cluster={self.cluster!r}, durability={self.durability.value!r})")

    def replica_wait(self) -> ReplicaWait | None:
        """What each round trip waits for under replicated durability; None: local."""
        if self.durability is Durability.LOCAL:
            return None
        return ReplicaWait(replicas=1, timeout_ms=int(self.replica_timeout_s * 1000))

    def connect(self) -> RedisClient:
        """The injected client, or a new redis-py client for ``url`` (``Redis`` or
        ``RedisCluster``, :func:`eoguard.store.client.connect`)."""
        if self.client is not None:
            return self.client
        kwargs: dict[str, Any] = {
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
            "health_check_interval": 30,
            **self.options,
        }
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        assert self.url is not None
        try:
            client = connect(self.url, cluster=self.cluster, **kwargs)
        except (ValueError, TypeError) as exc:
            # redis-py's message may quote part of the password: name the URL, redacted, instead.
            raise ConfigError(f"invalid Redis URL {redact_url(self.url)} ({type(exc).__name__})") from None
        return client


# --- Schema Registry ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class SchemaRegistryConfig:
    """Where payload schemas are registered and fetched by id (the header wire format,
    docs/design.md §3): a URL, or a client the application built (confluent-kafka's
    ``SchemaRegistryClient`` or one with its methods).

    ``options`` go to ``SchemaRegistryClient`` beside the URL (``basic.auth.user.info``,
    ``ssl.ca.location``, ``timeout``, ...); they never appear in a ``repr``.
    ``auto_register`` (producers only): register a payload schema under ``<topic>-value`` on
    its first send; False requires it registered already (a refusal is a
    :class:`~eoguard.errors.SchemaRefusedError` naming the subject).
    """

    url: str | None = None
    client: Any = field(default=None, repr=False, compare=False)
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    auto_register: bool = True

    def __post_init__(self) -> None:
        if (self.url is None) == (self.client is None):
            raise ConfigError("SchemaRegistryConfig needs exactly one of url= or client=")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"Schema Registry url must start with http:// or https://, "
                              f"got {_redact_url(self.url)!r}")
        if not isinstance(self.auto_register, bool):
            raise ConfigError("auto_register must be True or False")

    def __repr__(self) -> str:
        target = "client=<injected>" if self.client is not None else f"url={_redact_url(self.url)!r}"
        return f"SchemaRegistryConfig({target}, auto_register={self.auto_register!r})"

    def payloads(self, schemas: SchemaRegistry | None) -> RegistryPayloads:
        """The payload codec over :meth:`connect`'s client and ``schemas`` (the local ones);
        its ``close()`` closes a client built here, never an injected one."""
        return RegistryPayloads(self.connect(), schemas, auto_register=self.auto_register,
                                owns_client=self.client is None)

    def connect(self) -> Any:
        """The injected client, or a confluent-kafka ``SchemaRegistryClient`` for ``url``
        (the ``registry`` extra: ``confluent-kafka[avro,schemaregistry]``)."""
        if self.client is not None:
            return self.client
        try:
            from confluent_kafka.schema_registry import (  # noqa: PLC0415 - the registry extra
                SchemaRegistryClient,
            )
        except ImportError as exc:
            raise ConfigError(f"the header wire format needs confluent-kafka's Schema Registry "
                              f"client: pip install 'eoguard[registry]' ({exc})") from exc
        try:
            return SchemaRegistryClient({"url": self.url, **self.options})
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid Schema Registry configuration for "
                              f"{_redact_url(self.url or '')}: {exc}") from None


def _check_registry(registry: object, *, event_source: object = "-") -> None:
    """The header format's settings are of their types (a producer's ``event_source`` too)."""
    if registry is not None and not isinstance(registry, SchemaRegistryConfig):
        raise ConfigError("schema_registry must be a SchemaRegistryConfig")
    if not isinstance(event_source, str) or not event_source:
        raise ConfigError("event_source must be a non-empty string (the ce_source header)")


# --- Producer ----------------------------------------------------------------------------


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
        _check_registry(self.schema_registry, event_source=self.event_source)
        if not isinstance(self.kafka, Mapping) or not self.kafka.get("bootstrap.servers"):
            raise ConfigError("kafka config must be a mapping with 'bootstrap.servers'")
        object.__setattr__(self, "kafka", dict(self.kafka))
        if not isinstance(self.redis, RedisConfig):
            raise ConfigError("redis must be a RedisConfig")
        for name in ("default_ttl_s", "max_message_bytes", "max_queue_messages",
                     "max_queue_bytes", "send_timeout_s", "lease_s", "recover_interval_s",
                     "batch_max_messages"):
            _positive(name, getattr(self, name))
        if not 0 < self.delay_min_ms <= self.delay_max_ms:
            raise ConfigError(f"need 0 < delay_min_ms <= delay_max_ms, "
                              f"got {self.delay_min_ms} and {self.delay_max_ms}")
        if self.max_message_bytes > self.max_queue_bytes:
            raise ConfigError("max_message_bytes must not exceed max_queue_bytes")
        timeout_ms = self.message_timeout_ms
        if self.resend_after_s is not None:
            _positive("resend_after_s", self.resend_after_s)
            if self.resend_after_s * 1000 <= timeout_ms:
                raise ConfigError(
                    f"resend_after_s ({self.resend_after_s}) must exceed librdkafka's "
                    f"message.timeout.ms ({timeout_ms} ms): a live producer is still retrying"
                )
        if self.lease_s < 0.3:
            raise ConfigError("lease_s must be at least 0.3 s (heartbeats run every lease_s/3)")
        _check_limits(self.keyspace, self.input_limits)
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
            _positive(name, getattr(self, name))
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
        _check_limits(self.keyspace, self.input_limits)
        if self.instance_id is not None and not self.instance_id:
            raise ConfigError("instance_id must be non-empty when given")
        _check_registry(self.schema_registry)
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
