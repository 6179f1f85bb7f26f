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
does not have), :class:`BadMagicError` (not framed), :class:`CorruptRecordError` (the body is
not a record of its writer schema, or does not resolve), :class:`RegistryUnavailableError`
(unreachable, timed out, HTTP 5xx, credentials refused: retry later).
"""

from __future__ import annotations

import json
import logging
import threading
from io import BytesIO
from typing import Any, Protocol

from fastavro import schemaless_reader

from eoguard.codec.payload import PayloadCodec
from eoguard.codec.schemas import RegisteredSchema, SchemaRegistry
from eoguard.errors import (
    BadMagicError,
    ConfigError,
    CorruptRecordError,
    EoguardError,
    RegistryUnavailableError,
    SchemaRefusedError,
    UnknownSchemaIdError,
)

__all__ = ["FRAME_SIZE", "RegistryClient", "RegistryPayloads", "WriterSchema", "frame",
           "subject_for", "unframe"]

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

    def decode(self, value: bytes | None) -> tuple[Any, str]:
        """The object in a framed value, in the reader's version, and the writer schema's full
        name (module docstring for errors)."""
        schema_id, body = unframe(value)
        writer = self._writers.get(schema_id)
        if writer is None:
            writer = self.writer(schema_id)
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

    def writer(self, schema_id: int) -> WriterSchema:
        """The writer schema of ``schema_id`` and its reader (cached after the first call)."""
        try:
            fetched = self._client.get_schema(schema_id)
        except Exception as exc:
            outage = _unavailable(exc, f"fetching schema id {schema_id}")
            if outage is not None:
                raise outage from exc
            raise UnknownSchemaIdError(f"schema id {schema_id} is not in Schema Registry",
                                       schema_id=schema_id) from exc
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
