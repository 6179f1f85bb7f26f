"""Kafka record values: the envelope in Avro single-object encoding.

A value is ``C3 01``, the 8-byte little-endian CRC-64-AVRO fingerprint of the envelope
schema that wrote it, then the Avro binary body. Any Avro library reads it; Spark drops
the first 10 bytes and calls ``from_avro`` with ``schemas/envelope.avsc``.

The codec reads and writes with the envelope schema's logical types stripped (same
fingerprint, same bytes), so times stay integer epoch milliseconds and the id a string:
no datetime or UUID objects are built on the hot path. A value written by an older
envelope version (any ``eoguard.Envelope`` in the registry, matched by fingerprint) is
resolved to the current version with Avro's schema resolution rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from eoguard.codec import envelope_writer
from eoguard.codec.schemas import SchemaRegistry
from eoguard.envelope import Envelope
from eoguard.errors import (
    BadMagicError,
    CodecError,
    CorruptRecordError,
    UnknownFingerprintError,
)

__all__ = ["ENVELOPE_SCHEMA", "HEADER_SIZE", "MAGIC", "EnvelopeCodec"]

MAGIC = b"\xc3\x01"
"""The Avro single-object encoding marker."""
HEADER_SIZE = 10
"""Marker (2 bytes) plus schema fingerprint (8 bytes); the Avro body starts after it."""
ENVELOPE_SCHEMA = "eoguard.Envelope"
"""Full name of the envelope schema (``schemas/envelope.avsc``)."""


def _slot_setters() -> tuple[Callable[[Envelope, Any], None], ...]:
    slots = ("id", "expires_at_ms", "created_at_ms", "producer", "attempt",
             "payload_schema", "payload", "headers", "payload_fingerprint")
    assert set(slots) == {f.name for f in dataclasses.fields(Envelope)}
    return tuple(vars(Envelope)[name].__set__ for name in slots)


_SET_ID, _SET_EXPIRES, _SET_CREATED, _SET_PRODUCER, _SET_ATTEMPT, _SET_SCHEMA, _SET_PAYLOAD, \
    _SET_HEADERS, _SET_PAYLOAD_FP = _slot_setters()


def _envelope_from_record(record: dict[str, Any]) -> Envelope:
    """An Envelope from a record the reader just decoded against the envelope schema.

    Fills the slots directly: the frozen dataclass ``__init__`` goes through
    ``object.__setattr__`` per field and costs twice as much, on the consumer's hot path.
    """
    env: Envelope = object.__new__(Envelope)
    _SET_ID(env, record["id"])
    _SET_EXPIRES(env, record["expires_at"])
    _SET_CREATED(env, record["created_at"])
    _SET_PRODUCER(env, record["producer"])
    _SET_ATTEMPT(env, record["attempt"])
    _SET_SCHEMA(env, record["payload_schema"])
    _SET_PAYLOAD(env, record["payload"])
    _SET_HEADERS(env, record["headers"])
    _SET_PAYLOAD_FP(env, record.get("payload_fingerprint"))  # absent: a pre-3 schema dir
    return env


class EnvelopeCodec:
    """Encode and decode :class:`Envelope` as Kafka record values.

    ``decode`` raises :class:`BadMagicError` (no ``C3 01`` marker or shorter than the
    header), :class:`UnknownFingerprintError` (not a known envelope version) or
    :class:`CorruptRecordError` (body truncated, invalid, or followed by extra bytes).
    """

    __slots__ = ("_current", "_hand_written", "_header", "_producer", "_readers", "_registry")

    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self._registry = SchemaRegistry.default() if registry is None else registry
        self._current = self._registry.get(ENVELOPE_SCHEMA)
        self._header = MAGIC + self._current.fingerprint
        # The hand-written writer when the current schema is the one it writes.
        self._hand_written = self._current.fingerprint == envelope_writer.WRITES
        self._producer = ("", envelope_writer.text(""))  # the last producer, written
        # fingerprint -> (writer schema, reader schema or None when writer is current)
        self._readers: dict[bytes, tuple[Any, Any]] = {self._current.fingerprint:
                                                       (self._current.plain, None)}

    @property
    def registry(self) -> SchemaRegistry:
        """The registry the envelope versions (and payload schemas) come from."""
        return self._registry

    @property
    def fingerprint(self) -> bytes:
        """8-byte fingerprint of the current envelope schema, as written in every value."""
        return self._current.fingerprint

    @property
    def schema_json(self) -> dict[str, Any]:
        """The current envelope schema JSON (what Spark's ``from_avro`` needs)."""
        return self._current.schema

    def encode(self, envelope: Envelope) -> bytes:
        """The single-object encoding of ``envelope``; :class:`CodecError` if a field has
        a value its Avro type cannot hold."""
        if self._hand_written:
            return self.encode_fields(
                envelope.id, envelope.expires_at_ms, envelope.created_at_ms,
                producer=envelope.producer, attempt=envelope.attempt,
                payload_schema=envelope.payload_schema, payload=envelope.payload,
                headers=envelope.headers, payload_fingerprint=envelope.payload_fingerprint)
        return self._encode_with_fastavro(envelope)

    def encode_fields(self, message_id: str, expires_at_ms: int, created_at_ms: int, *,
                      producer: str, attempt: int, payload_schema: str | None, payload: bytes,
                      headers: dict[str, str], payload_fingerprint: bytes | None) -> bytes:
        """:meth:`encode` of the envelope with these fields, without building it first (the
        producer's per-message path)."""
        if not self._hand_written:
            return self._encode_with_fastavro(Envelope(
                id=message_id, expires_at_ms=expires_at_ms, created_at_ms=created_at_ms,
                producer=producer, attempt=attempt, payload_schema=payload_schema,
                payload=payload, headers=headers, payload_fingerprint=payload_fingerprint))
        try:
            last = self._producer
            if producer is not last[0]:
                last = self._producer = (producer, envelope_writer.text(producer))
            return self._header + envelope_writer.write_body(
                message_id, expires_at_ms, created_at_ms, producer=last[1], attempt=attempt,
                payload_schema=payload_schema, payload=payload, headers=headers,
                payload_fingerprint=payload_fingerprint)
        except (TypeError, ValueError, AttributeError, UnicodeEncodeError) as exc:
            raise CodecError(f"envelope {message_id!r} does not fit {ENVELOPE_SCHEMA}: "
                             f"{exc}") from exc

    def _encode_with_fastavro(self, envelope: Envelope) -> bytes:
        out = BytesIO()
        out.write(self._header)
        record = {
            "id": envelope.id,
            "expires_at": envelope.expires_at_ms,
            "created_at": envelope.created_at_ms,
            "producer": envelope.producer,
            "attempt": envelope.attempt,
            "payload_schema": envelope.payload_schema,
            "payload": envelope.payload,
            "headers": envelope.headers,
            "payload_fingerprint": envelope.payload_fingerprint,
        }
        try:
            schemaless_writer(out, self._current.plain, record)
        except Exception as exc:
            raise CodecError(f"envelope {envelope.id!r} does not fit {ENVELOPE_SCHEMA}: "
                             f"{exc}") from exc
        return out.getvalue()

    def decode(self, value: bytes | bytearray | memoryview | None) -> Envelope:
        """The envelope in a Kafka record value (see the class docstring for errors)."""
        if value is None or len(value) < HEADER_SIZE:
            size = "no value" if value is None else f"{len(value)} bytes"
            raise BadMagicError(f"not an eoguard envelope: {size}, need at least {HEADER_SIZE}")
        if type(value) is not bytes:
            value = bytes(value)
        if value[:2] != MAGIC:
            raise BadMagicError(f"not an eoguard envelope: starts with {value[:2].hex()}, "
                                f"expected c301")
        fingerprint = value[2:HEADER_SIZE]
        schemas = self._readers.get(fingerprint)
        if schemas is None:
            schemas = self._resolve(fingerprint)
        body = BytesIO(value)
        body.seek(HEADER_SIZE)
        try:
            record: Any = schemaless_reader(body, schemas[0], schemas[1])
        except Exception as exc:
            raise CorruptRecordError(f"envelope body is not valid {ENVELOPE_SCHEMA}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if body.tell() != len(value):
            raise CorruptRecordError(f"envelope body has {len(value) - body.tell()} trailing "
                                     f"bytes after the record")
        return _envelope_from_record(record)

    def _resolve(self, fingerprint: bytes) -> tuple[Any, Any]:
        """Reader pair for an older envelope version; cached after the first record."""
        entry = self._registry.by_fingerprint(fingerprint)
        if entry.name != ENVELOPE_SCHEMA:
            raise UnknownFingerprintError(
                f"fingerprint {fingerprint.hex()} is schema {entry.name}, not an envelope",
                fingerprint=fingerprint,
            )
        pair = (entry.plain, self._current.plain)
        self._readers[fingerprint] = pair
        return pair
