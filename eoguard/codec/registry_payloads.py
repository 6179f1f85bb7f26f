"""Payloads framed for Schema Registry: what a registry serializer writes, and reading it back.

A framed value is the magic byte 0, the schema id (4 bytes, big-endian) and the Avro body.
Writing: the body is :class:`~eoguard.codec.payload.PayloadCodec`'s (the application's
schema from ``schemas/``, validated), the id the one Schema Registry gives that schema under
the subject ``<topic>-value`` (Confluent's default subject name strategy): registered on first
use, or looked up only (``auto_register=False``: schemas are registered by a pipeline, not by
producers). So the bytes are those confluent-kafka's ``AvroSerializer`` writes for the same
schema. Reading: the writer schema comes by id, and is resolved into the reader's current
version of the same full name when ``schemas/`` has one (else the writer's own), by Avro's
rules, as :class:`PayloadCodec` resolves envelope payloads. Both directions cache per subject
and per id: one registry call per schema and process.

Errors: :class:`SchemaRefusedError` (incompatible with the subject's latest version, invalid,
or not registered while registering is off), :class:`UnknownSchemaIdError` (an id the registry
does not serve: any answer but an outage, :func:`fetch_refusal`), :class:`BadMagicError` (not
framed), :class:`CorruptRecordError` (the body is not a record of its writer schema, or does
not resolve), :class:`RegistryUnavailableError` (unreachable, timed out, HTTP 5xx, credentials
refused: retry later).

Unknown ids are remembered for a moment (:class:`UnknownIds`), so a flood of records naming
one asks the registry about once per batch or per ``UNKNOWN_ID_TTL_S``, not once per record.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from io import BytesIO
from typing import Any, Protocol

from fastavro import schemaless_reader

from eoguard.codec.payload import PayloadCodec
from eoguard.codec.schemas import RegisteredSchema, SchemaRegistry
from eoguard.envelope import now_ms
from eoguard.errors import (
    BadMagicError,
    ConfigError,
    CorruptRecordError,
    EoguardError,
    RegistryUnavailableError,
    SchemaRefusedError,
    UnknownSchemaIdError,
)

__all__ = ["FRAME_SIZE", "UNKNOWN_ID_TTL_S", "RegistryClient", "RegistryPayloads", "UnknownIds",
           "WriterSchema", "fetch_refusal", "frame", "subject_for", "unframe"]

log = logging.getLogger(__name__)

FRAME_SIZE = 5
"""The magic byte 0 and the 4-byte schema id before the Avro body."""
_MAGIC = 0


class RegistryClient(Protocol):
    """What eoguard uses of confluent-kafka's ``SchemaRegistryClient``."""

    def register_schema(self, subject_name: str, schema: Any,
                        normalize_schemas: bool = False) -> int: ...
    def lookup_schema(self, subject_name: str, schema: Any, normalize_schemas: bool = False,
                      fmt: str | None = None, deleted: bool = False) -> Any: ...
    def get_schema(self, schema_id: int, subject_name: str | None = None,
                   fmt: str | None = None, reference_format: str | None = None) -> Any: ...
    def get_latest_version(self, subject_name: str, fmt: str | None = None) -> Any: ...


def subject_for(topic: str) -> str:
    """The subject of a topic's record values (Confluent's TopicNameStrategy)."""
    return f"{topic}-value"


def frame(schema_id: int, body: bytes) -> bytes:
    """``body`` framed with ``schema_id`` (what a registry serializer writes)."""
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def unframe(value: bytes | None) -> tuple[int, bytes]:
    """The schema id and the Avro body of a framed value; :class:`BadMagicError` when it is
    not framed (no body after the 5 bytes, as confluent-kafka's deserializer also refuses)."""
    if value is None or len(value) <= FRAME_SIZE:
        size = "no value" if value is None else f"{len(value)} bytes"
        raise BadMagicError(f"not a Schema Registry framed value: {size}, need more than "
                            f"{FRAME_SIZE}")
    if value[0] != _MAGIC:
        raise BadMagicError(f"not a Schema Registry framed value: starts with "
                            f"{value[:1].hex()}, expected 00")
    return int.from_bytes(value[1:FRAME_SIZE], "big"), bytes(value[FRAME_SIZE:])


def _status(exc: Exception) -> int | None:
    """The HTTP status of a confluent-kafka ``SchemaRegistryError`` (None for any other
    error: a connection or a timeout)."""
    status = getattr(exc, "http_status_code", None)
    return status if isinstance(status, int) else None


def _unavailable(exc: Exception, doing: str) -> EoguardError | None:
    """The RegistryUnavailableError for ``exc`` when it is an outage (anything but an HTTP
    answer under 500, or credentials refused), else None."""
    status = _status(exc)
    if status is None or status >= 500 or status in (401, 403):
        what = f"HTTP {status}" if status is not None else type(exc).__name__
        return RegistryUnavailableError(f"Schema Registry failed {doing} ({what}: {exc})")
    return None


def fetch_refusal(exc: Exception, schema_id: int) -> EoguardError:
    """What a failed fetch of ``schema_id`` (a record's) means, for the consumer and the Spark
    job alike: :class:`RegistryUnavailableError` for an outage (retry; never a dead letter),
    else :class:`UnknownSchemaIdError` (a dead letter). Any answer under 500 but 401/403 is
    the latter, 404 or not: the id comes from an untrusted record, and a registry may answer
    400 or 422 for an id it cannot serve (docs/design.md §3); stopping on that answer would
    let one such record stop the topic."""
    outage = _unavailable(exc, f"fetching schema id {schema_id}")
    if outage is not None:
        return outage
    status = _status(exc)
    why = "is not in Schema Registry" if status == 404 else \
        f"is refused by Schema Registry (HTTP {status}: {exc})"
    return UnknownSchemaIdError(f"schema id {schema_id} {why}", schema_id=schema_id)


UNKNOWN_ID_TTL_S = 2.0
"""How long an unknown schema id's answer is reused (:class:`UnknownIds`)."""
_UNKNOWN_IDS = 1024  # unknown ids remembered at most (a flood of random ids stays bounded)


class UnknownIds:
    """Schema ids the registry said it does not serve, each with the time it was asked: the
    bounded, short-lived negative cache of :meth:`RegistryPayloads.decode`.

    The answer is reused for a record only if that record was created before the question was
    asked (by ``created_at_ms``) and within ``ttl_s`` of it. Why that never dead-letters a
    valid record whose schema was registered a moment later: a producer frames a record with
    an id only after the registry gave it that id, so a record naming an id the registry did
    not have at the time ``t`` of our question was written after ``t``; its ``created_at`` is
    then after ``t`` and it is asked about again (and found). A record created before ``t``
    that names an id unknown at ``t`` is not a valid record of that id. What is left: a
    producer whose clock runs behind ours stamps a record written after ``t`` with a time
    before it; the TTL bounds that window to ``ttl_s`` after the question (and the clock's lag
    must exceed the record's real age at ``t``). A record without a creation time
    (``created_at_ms=None``, ``eoguard browse``: nothing is dead-lettered) reuses the answer
    within the TTL. In a flood the first record of a batch asks and the records written before
    that question reuse its answer: one call per batch (or per TTL for a backlog), not per
    record. The cache holds at most 1,024 ids, the oldest question dropped first.
    """

    __slots__ = ("_asked", "_limit", "_ttl_s")

    def __init__(self, ttl_s: float = UNKNOWN_ID_TTL_S, limit: int = _UNKNOWN_IDS) -> None:
        self._ttl_s = ttl_s
        self._limit = limit
        # schema id -> (monotonic deadline, wall time asked in epoch ms, the error's text)
        self._asked: dict[int, tuple[float, int, str]] = {}

    def known_unknown(self, schema_id: int, created_at_ms: int | None) -> str | None:
        """The remembered answer's text when it may be reused for this record, else None."""
        asked = self._asked.get(schema_id)
        if asked is None:
            return None
        deadline, asked_at_ms, reason = asked
        if time.monotonic() >= deadline:
            del self._asked[schema_id]
            return None
        if created_at_ms is not None and created_at_ms >= asked_at_ms:
            return None
        return reason

    def remember(self, schema_id: int, asked_at_ms: int, reason: str) -> None:
        """The registry said ``schema_id`` is unknown to a question asked at ``asked_at_ms``."""
        self._asked.pop(schema_id, None)  # re-inserted last: the newest question
        if len(self._asked) >= self._limit:
            del self._asked[next(iter(self._asked))]
        self._asked[schema_id] = (time.monotonic() + self._ttl_s, asked_at_ms, reason)

    def __len__(self) -> int:
        return len(self._asked)


class WriterSchema:
    """A writer schema fetched by id, and the reader schema it resolves into."""

    __slots__ = ("name", "reader", "writer")

    def __init__(self, name: str, writer: Any, reader: Any) -> None:
        self.name = name  # full name of the writer schema
        self.writer = writer  # fastavro-parsed, with logical types
        self.reader = reader  # the reader's current version; None: read as written


class RegistryPayloads:
    """Encode payloads framed for Schema Registry and decode them back (module docstring)."""

    def __init__(self, client: RegistryClient, schemas: SchemaRegistry | None = None, *,
                 auto_register: bool = True, validate: bool = True,
                 owns_client: bool = False) -> None:
        self._client = client
        self._owns_client = owns_client  # closed by close(): built from a URL, not injected
        self._schemas = SchemaRegistry.default() if schemas is None else schemas
        self._payloads = PayloadCodec(self._schemas, validate=validate)
        self._auto_register = auto_register
        self._heads: dict[tuple[str, str], bytes] = {}  # (subject, schema) -> the 5 bytes
        self._writers: dict[int, WriterSchema] = {}
        self._unknown = UnknownIds()
        self._lock = threading.Lock()  # one registration per subject and schema at a time

    def close(self) -> None:
        """Close the registry client's connections, when this object built it."""
        if self._owns_client:
            close = getattr(self._client, "close", None)
            if close is not None:
                close()

    @property
    def schemas(self) -> SchemaRegistry:
        """The local schemas: what producers write, what readers resolve into."""
        return self._schemas

    def encode(self, obj: Any, schema: str, *, topic: str) -> bytes:
        """``obj`` encoded with the current version of ``schema``, framed with its id under
        ``topic``'s subject (module docstring for errors)."""
        subject = subject_for(topic)
        head = self._heads.get((subject, schema))
        if head is None:
            head = self._head(subject, schema)
        return head + self._payloads.encode(obj, schema)

    def knows(self, schema: str, *, topic: str) -> bool:
        """Whether :meth:`encode` has ``schema``'s id under ``topic``'s subject already (else
        its first call asks Schema Registry)."""
        return (subject_for(topic), schema) in self._heads

    def schema_id(self, schema: str, *, topic: str) -> int:
        """The id :meth:`encode` frames ``schema`` with under ``topic``'s subject."""
        subject = subject_for(topic)
        head = self._heads.get((subject, schema)) or self._head(subject, schema)
        return int.from_bytes(head[1:], "big")

    def _head(self, subject: str, name: str) -> bytes:
        entry = self._schemas.get(name)  # SchemaNotFoundError before any call
        from confluent_kafka.schema_registry import Schema  # noqa: PLC0415 - the registry extra

        text = json.dumps(entry.schema)
        with self._lock:
            head = self._heads.get((subject, name))
            if head is not None:
                return head
            try:
                if self._auto_register:
                    schema_id = self._client.register_schema(subject, Schema(text, "AVRO"))
                else:
                    schema_id = self._client.lookup_schema(subject, Schema(text, "AVRO")).schema_id
            except Exception as exc:  # SchemaRegistryError or a transport error of httpx
                raise self._refusal(exc, subject, name) from exc
            head = self._heads[subject, name] = frame(int(schema_id), b"")
            return head

    def _refusal(self, exc: Exception, subject: str, name: str) -> EoguardError:
        outage = _unavailable(exc, f"registering {name} under {subject}")
        if outage is not None:
            return outage
        status = _status(exc)
        if status == 404:
            return SchemaRefusedError(
                f"schema {name} is not registered under subject {subject} (producers "
                f"register nothing: auto_register=False): {exc}", subject=subject,
                version=None, registered=False)
        version = None
        if status == 409:
            try:
                version = int(self._client.get_latest_version(subject).version)
            except Exception:  # only for the message: the refusal stands without it
                log.debug("no latest version of %s", subject, exc_info=True)
        against = f" version {version}" if version is not None else " its versions"
        return SchemaRefusedError(
            f"Schema Registry refused schema {name} under subject {subject}"
            + (f": incompatible with{against}" if status == 409 else "") + f" ({exc})",
            subject=subject, version=version)

    def decode(self, value: bytes | None, created_at_ms: int | None = None
               ) -> tuple[Any, str]:
        """The object in a framed value, in the reader's version, and the writer schema's full
        name (module docstring for errors). ``created_at_ms``: when the record was created,
        for the unknown ids' cache (:class:`UnknownIds`)."""
        schema_id, body = unframe(value)
        writer = self._writers.get(schema_id)
        if writer is None:
            writer = self._writer_of_record(schema_id, created_at_ms)
        data = BytesIO(body)
        try:
            obj = schemaless_reader(data, writer.writer, writer.reader)
        except Exception as exc:
            raise CorruptRecordError(f"payload is not a valid {writer.name} record (schema id "
                                     f"{schema_id}): {type(exc).__name__}: {exc}") from exc
        if data.tell() != len(body):
            raise CorruptRecordError(f"payload of schema id {schema_id} has "
                                     f"{len(body) - data.tell()} trailing bytes")
        return obj, writer.name

    def _writer_of_record(self, schema_id: int, created_at_ms: int | None) -> WriterSchema:
        """:meth:`writer` for a record created at ``created_at_ms``, through the unknown ids'
        cache."""
        reason = self._unknown.known_unknown(schema_id, created_at_ms)
        if reason is not None:
            raise UnknownSchemaIdError(reason, schema_id=schema_id)
        asked_at_ms = now_ms()  # before the question: a later registration is after it
        try:
            return self.writer(schema_id)
        except UnknownSchemaIdError as exc:
            self._unknown.remember(schema_id, asked_at_ms, str(exc))
            raise

    def writer(self, schema_id: int) -> WriterSchema:
        """The writer schema of ``schema_id`` and its reader (cached after the first call)."""
        try:
            fetched = self._client.get_schema(schema_id)
        except Exception as exc:
            raise fetch_refusal(exc, schema_id) from exc
        kind = getattr(fetched, "schema_type", "AVRO") or "AVRO"
        if kind != "AVRO":
            raise CorruptRecordError(f"schema id {schema_id} is a {kind} schema, not Avro")
        try:
            entry = RegisteredSchema.from_json(json.loads(fetched.schema_str))
        except (ValueError, ConfigError) as exc:
            raise CorruptRecordError(f"schema id {schema_id} is not a named Avro schema eoguard "
                                     f"reads: {exc}") from exc
        reader = None
        if entry.name in self._schemas:
            current = self._schemas.get(entry.name)
            reader = None if current.fingerprint == entry.fingerprint else current.parsed
        found = self._writers[schema_id] = WriterSchema(entry.name, entry.parsed, reader)
        return found
