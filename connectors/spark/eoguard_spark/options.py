"""Options of the Spark job: one frozen, keyword-only dataclass, checked at construction."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eoguard.codec import InputLimits
from eoguard.credentials import kafka_jaas_login
from eoguard.errors import ConfigError
from eoguard.store.keys import (
    DEFAULT_MAX_TTL_MS,
    DEFAULT_PREFIX,
    DEFAULT_SHARDS,
    KeySpace,
    check_scope,
)
from eoguard_spark.avro_schema import avro_id_type, avro_record_schema

__all__ = ["AvroFraming", "DedupMode", "JobOptions", "PlainFormat", "PlainOptions"]


class DedupMode(str, enum.Enum):
    """How the job drops duplicates (connectors/spark/README.md compares them)."""

    REDIS = "redis"
    """Claims on the scope's Redis dedup keys: shared with GuardedConsumers, survives restarts."""
    WATERMARK = "watermark"
    """Spark's ``dropDuplicatesWithinWatermark``: this query's rows only, within the watermark."""
    NONE = "none"
    """No dedup at all (decode, expiry and dead letters only); a baseline for benchmarks."""


class PlainFormat(str, enum.Enum):
    """How the job reads the value of a plain record (one that is not an envelope)."""

    JSON = "json"
    """A UTF-8 JSON document; with ``json_schema`` (a Spark DDL string such as ``order_id
    string, total_cents bigint``) a value of other types is malformed."""
    RAW = "raw"
    """Bytes the job does not read: the id must come from a header."""
    AVRO = "avro"
    """Avro binary read with the reader schema ``avro_schema`` (the JSON of a record schema),
    laid out as ``avro_framing`` says; a value that is not a record of it is malformed."""


class AvroFraming(str, enum.Enum):
    """How a plain Avro value's bytes are laid out around the Avro body."""

    REGISTRY = "registry"
    """Schema Registry framing, what Confluent's ``AvroSerializer`` writes: a magic byte 0, a
    4-byte schema id, then the body. The job checks the magic byte and skips the id: it does
    not look the id up, the body is read with ``avro_schema``."""
    NONE = "none"
    """The Avro body alone (fastavro's ``schemaless_writer``, Avro's ``BinaryEncoder``)."""


_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A JSON id field the job can name in a JSON path as the consumer names it in a dict."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlainOptions:
    """The rules for records that are not envelopes (docs/design.md §6, "Plain topics").

    The id is ``message_id_for(id_namespace, key)``, the key from exactly one of ``id_field``
    (a top-level field of the JSON or Avro value: text, or an integer as its decimal digits)
    or ``id_header`` (the bytes of the header's last value); the expiry is the record's Kafka
    timestamp plus ``ttl_s``. Format ``avro`` needs ``avro_schema`` (the reader schema's
    JSON, a record) and ``avro_framing``; it is checked here with fastavro, and the id field
    must be a string, int or long of it.
    A GuardedConsumer with ``PlainRecords(id_rule=id_from_field(ns, field) | id_from_header(ns,
    header), lifetime=Lifetime(ttl_s=...))`` keys the same record the same way.
    """

    format: PlainFormat
    id_namespace: str
    ttl_s: float
    json_schema: str | None = None
    id_field: str | None = None
    id_header: str | None = None
    avro_schema: str | None = None
    avro_framing: AvroFraming | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "format", PlainFormat(self.format))
        except ValueError:
            raise ConfigError(f"plain format {self.format!r} is not one of "
                              f"{[f.value for f in PlainFormat]}") from None
        if not isinstance(self.id_namespace, str) or not self.id_namespace:
            raise ConfigError("plain id_namespace must be a non-empty string")
        ttl = self.ttl_s
        if (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl)
                or ttl <= 0):
            raise ConfigError(f"plain ttl_s must be a positive number, got {ttl!r}")
        if (self.id_field is None) == (self.id_header is None):
            raise ConfigError("plain records need exactly one of id_field or id_header")
        for name in ("id_field", "id_header", "json_schema"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"plain {name} must be a non-empty string, got {value!r}")
        if self.id_field is not None and self.format is PlainFormat.RAW:
            raise ConfigError("plain format raw has no fields: give id_header")
        if self.id_field is not None and not _FIELD.fullmatch(self.id_field):
            raise ConfigError(f"plain id_field {self.id_field!r}: a top-level field name of "
                              f"letters, digits and '_'")
        if self.json_schema is not None and self.format is not PlainFormat.JSON:
            raise ConfigError("plain json_schema is for format json")
        self._check_avro()

    def _check_avro(self) -> None:
        if self.format is not PlainFormat.AVRO:
            if self.avro_schema is not None or self.avro_framing is not None:
                raise ConfigError("plain avro_schema and avro_framing are for format avro")
            return
        if self.avro_schema is None:
            raise ConfigError("plain format avro needs avro_schema (the reader schema's JSON)")
        if self.avro_framing is None:  # no default: a wrong guess reads bytes as other fields
            raise ConfigError("plain format avro needs avro_framing: 'registry' (Schema "
                              "Registry's magic byte and schema id first) or 'none'")
        try:
            object.__setattr__(self, "avro_framing", AvroFraming(self.avro_framing))
        except ValueError:
            raise ConfigError(f"plain avro_framing {self.avro_framing!r} is not one of "
                              f"{[f.value for f in AvroFraming]}") from None
        schema = avro_record_schema(self.avro_schema)
        if self.id_field is not None:
            avro_id_type(schema, self.id_field)

    def check(self, *, max_ttl_ms: int, payload_schema: str | None) -> None:
        """What the rules must agree on with the rest of the job's options."""
        if payload_schema is not None:
            raise ConfigError("plain records and payload_schema: not supported together "
                              "(a plain record's payload stays its raw bytes)")
        if self.ttl_s * 1000 > max_ttl_ms:
            raise ConfigError(f"plain ttl_s ({self.ttl_s}) exceeds max_ttl_ms ({max_ttl_ms})")


def _kafka_options(options: Mapping[str, str]) -> dict[str, str]:
    for key in options:
        if key in ("subscribe", "subscribePattern", "assign"):
            raise ConfigError(f"kafka option {key!r}: name the topics with topics=")
    return dict(options)


def _check_registry_url(url: object) -> None:
    if url is not None and (not isinstance(url, str)
                            or not url.startswith(("http://", "https://"))):
        raise ConfigError("schema_registry_url must start with http:// or https://")


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOptions:
    """Everything the job needs. Durations carry their unit; Spark intervals are strings.

    ``output_path`` is the idempotent Parquet sink (one ``batch_id=N`` directory per
    micro-batch); a ``foreach_batch`` hook given to :func:`eoguard_spark.job.build_query`
    may replace or complement it. ``lease_s`` must outlast a micro-batch from claim to done
    mark, or a GuardedConsumer of the scope may take a claim over and handle the message too.

    ``reader`` names this query in its claims' positions, ``position(reader, topic,
    partition, offset)`` (a GuardedConsumer names its group id there), and in its micro-batch
    tokens: two readers of one record in one scope are two positions, so only one handles it.
    It must be unique among the scope's readers and stay the same for a checkpoint (a replayed
    micro-batch re-owns its claims through it), so the first batch records it in the
    checkpoint; by default it is ``spark-`` and the first 12 hex digits of the query id Spark
    keeps in the checkpoint.

    ``header_format`` turns on records in the header wire format (docs/design.md §3): the
    source reads headers; raw payloads need nothing more. ``schema_registry_url`` (and
    ``schema_registry_options`` for its client: credentials, TLS) turns it on too and reads
    their Avro payloads by writer schema id (the ids fixed when the query starts;
    :func:`eoguard_spark.job.run` restarts it with a new one). Without a registry, a record
    whose payload is registry-framed Avro stops the query (:func:`eoguard_spark.job.run`
    raises a :class:`ConfigError` naming ``schema_registry_url``) before anything of its
    micro-batch is committed; it is read once the job runs with one.
    """

    bootstrap: str
    topics: tuple[str, ...]
    scope: str
    checkpoint: str
    output_path: str | None = None
    dead_letter_path: str | None = None
    # The local stack's Redis, as python -m eoguard_spark's last resort; the library reads no
    # EOGUARD_* endpoint variable (docs/operations.md).
    redis_url: str = field(default="redis://127.0.0.1:16379/0", repr=False)
    key_prefix: str = DEFAULT_PREFIX
    key_shards: int = DEFAULT_SHARDS
    max_ttl_ms: int = DEFAULT_MAX_TTL_MS
    input_limits: InputLimits = field(default_factory=InputLimits)
    dedup: DedupMode = DedupMode.REDIS
    payload_schema: str | None = None
    schema_dir: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    trigger_interval: str | None = None
    available_now: bool = False
    watermark_delay: str = "10 minutes"
    lease_s: float = 300.0
    grace_s: float = 300.0
    busy_wait_s: float = 30.0
    claim_batch_size: int = 2000
    dead_letter_expired: bool = True
    ack_outbox: bool = True
    idempotent_sink: bool = False
    kafka_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    query_name: str | None = None
    reader: str | None = None
    plain: PlainOptions | None = None
    schema_registry_url: str | None = None
    schema_registry_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    header_format: bool = False

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ConfigError("bootstrap (Kafka bootstrap servers) must be given")
        if isinstance(self.topics, str) or not self.topics or not all(self.topics):
            raise ConfigError("topics must be a non-empty sequence of topic names")
        object.__setattr__(self, "topics", tuple(self.topics))
        check_scope(self.scope)
        if not self.checkpoint:
            raise ConfigError("checkpoint (a durable directory per query) must be given")
        object.__setattr__(self, "dedup", DedupMode(self.dedup))
        if self.reader is not None and (not self.reader.strip() or "\n" in self.reader):
            raise ConfigError(f"reader {self.reader!r} must be non-empty, on one line")
        self.keyspace()  # validates prefix, shards and max_ttl_ms
        if not isinstance(self.input_limits, InputLimits):
            raise ConfigError("input_limits must be an eoguard.InputLimits")
        for name in ("lease_s", "grace_s", "busy_wait_s", "claim_batch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger <= 0:
            raise ConfigError("max_offsets_per_trigger must be > 0 when given")
        if self.available_now and self.trigger_interval:
            raise ConfigError("give either available_now or trigger_interval, not both")
        if self.output_path is not None and self.output_path == self.dead_letter_path:
            raise ConfigError("output_path and dead_letter_path must differ")
        object.__setattr__(self, "kafka_options", _kafka_options(self.kafka_options))
        _check_registry_url(self.schema_registry_url)
        object.__setattr__(self, "header_format",  # what a registry is given for
                           bool(self.header_format) or self.schema_registry_url is not None)
        if self.plain is not None:
            if not isinstance(self.plain, PlainOptions):
                raise ConfigError("plain must be an eoguard_spark.PlainOptions")
            self.plain.check(max_ttl_ms=self.max_ttl_ms, payload_schema=self.payload_schema)

    def keyspace(self) -> KeySpace:
        """The Redis key space the scope's GuardedConsumers use too."""
        return KeySpace(prefix=self.key_prefix, shards=self.key_shards,
                        max_ttl_ms=self.max_ttl_ms)

    def source_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source: the user's, then what the job's guarantees need.

        ``failOnDataLoss=true`` (an offset that vanished is an error, not a silent skip) and
        ``kafka.isolation.level=read_committed`` (aborted transactions never reach a handler)
        are defaults the user may override through ``kafka_options``. Over SASL without a
        ``kafka.sasl.jaas.config``, the login comes from the environment
        (:func:`eoguard.credentials.kafka_jaas_login`).
        """
        out: dict[str, str] = {
            "failOnDataLoss": "true",
            "kafka.isolation.level": "read_committed",
            "startingOffsets": self.starting_offsets,
        }
        if self.max_offsets_per_trigger is not None:
            out["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        out.update(self.kafka_options)
        if (self.plain is not None and self.plain.id_header is not None) or \
                self.header_format:  # the header format's fields
            out["includeHeaders"] = "true"
        out["kafka.bootstrap.servers"] = self.bootstrap
        out["subscribe"] = ",".join(self.topics)
        return kafka_jaas_login(out)

    def describe(self) -> dict[str, Any]:
        """The options without secrets (Redis URL password, Kafka options), for logs."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__
                if name not in ("redis_url", "kafka_options", "schema_registry_url",
                                "schema_registry_options")}
