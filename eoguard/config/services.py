"""Where the services are: Redis (outbox and dedup keys) and the Schema Registry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eoguard.codec.registry_payloads import RegistryPayloads
from eoguard.codec.schemas import SchemaRegistry
from eoguard.config.checks import positive, redacted_url
from eoguard.errors import ConfigError
from eoguard.modes import Durability
from eoguard.redaction import redact, redact_url
from eoguard.store.client import RedisClient, connect
from eoguard.store.replicas import ReplicaWait


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
        positive("replica_timeout_s", self.replica_timeout_s)
        if (self.url is None) == (self.client is None):
            raise ConfigError("RedisConfig needs exactly one of url= or client=")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"Redis url must start with redis://, rediss:// or unix://, "
                              f"got {redacted_url(self.url)!r}")
        positive("socket_timeout_s", self.socket_timeout_s)
        positive("connect_timeout_s", self.connect_timeout_s)
        if self.client is not None:
            kwargs: Mapping[str, Any] = getattr(self.client, "get_connection_kwargs", dict)()
            if kwargs.get("decode_responses"):
                raise ConfigError("the injected Redis client must use decode_responses=False")

    def __repr__(self) -> str:
        target = "client=<injected>" if self.client is not None else f"url={redacted_url(self.url)!r}"
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


REGISTRY_TIMEOUT_S = 5.0
"""The bound on each phase (connect, send, each read) of one attempt of a request to a Schema
Registry built from a URL (httpx's own default)."""

_NUMERIC_OPTIONS: dict[str, type[float] | type[int]] = {
    "timeout": float, "max.retries": int, "retries.wait.ms": int, "retries.max.wait.ms": int}
"""The client's options that must be numbers (a command line gives them as text)."""


def _numeric(options: Mapping[str, Any]) -> dict[str, float | int]:
    """``options``' numeric settings as numbers; :class:`ConfigError` for one that is not a
    number, or is below its least (a timeout above 0, the others 0 or more)."""
    out: dict[str, float | int] = {}
    for name, kind in _NUMERIC_OPTIONS.items():
        if name not in options:
            continue
        value = options[name]
        try:
            if isinstance(value, bool):
                raise TypeError("a bool")
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"Schema Registry option {name} must be a number, got "
                              f"{value!r}") from None
        if number < 0 or (name == "timeout" and number == 0):
            raise ConfigError(f"Schema Registry option {name} must be "
                              f"{'above' if name == 'timeout' else 'at least'} 0, got {value!r}")
        out[name] = number
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class SchemaRegistryConfig:
    """Where payload schemas are registered and fetched by id (the header wire format,
    docs/design.md §3): a URL, or a client the application built (confluent-kafka's
    ``SchemaRegistryClient`` or one with its methods).

    ``options`` go to ``SchemaRegistryClient`` beside the URL (``basic.auth.user.info``,
    ``ssl.ca.location``, ``timeout``, ...); they never appear in a ``repr``. ``timeout`` is
    :data:`REGISTRY_TIMEOUT_S` unless given: confluent-kafka's client sets none, and a
    response that never comes would hold a consumer's poll loop for good. It bounds each
    phase of one attempt; a request that times out is sent again (``max.retries``, 3 by
    default, with backoff: about 30 s in all against a registry that never answers), then
    fails as a registry outage does. Numeric options may be given as text (a command line's).
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
                              f"got {redacted_url(self.url)!r}")
        if not isinstance(self.auto_register, bool):
            raise ConfigError("auto_register must be True or False")
        _numeric(self.options)

    def __repr__(self) -> str:
        target = "client=<injected>" if self.client is not None else f"url={redacted_url(self.url)!r}"
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
            return SchemaRegistryClient({"url": self.url, "timeout": REGISTRY_TIMEOUT_S,
                                         **self.options, **_numeric(self.options)})
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid Schema Registry configuration for "
                              f"{redacted_url(self.url or '')}: {exc}") from None


def check_registry(registry: object, *, event_source: object = "-") -> None:
    """The header format's settings are of their types (a producer's ``event_source`` too)."""
    if registry is not None and not isinstance(registry, SchemaRegistryConfig):
        raise ConfigError("schema_registry must be a SchemaRegistryConfig")
    if not isinstance(event_source, str) or not event_source:
        raise ConfigError("event_source must be a non-empty string (the ce_source header)")
