"""Application payloads: Avro binary bodies of the application's own schemas, or raw bytes.

The envelope names the payload's schema (``payload_schema``, a full name from
``schemas/``), so the payload itself is the bare Avro body. Decoding uses the schema's
logical types, so the handler gets back the form the application sent: ``datetime`` for
timestamp-millis, ``Decimal`` for decimal, ``UUID`` for uuid.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import validate

from eoguard.codec.schemas import SchemaRegistry
from eoguard.envelope import Envelope
from eoguard.errors import CorruptRecordError, PayloadEncodeError

__all__ = ["PayloadCodec"]


class PayloadCodec:
    """Encode application objects with a named schema from the registry, and back.

    ``schema=None`` means raw bytes: ``encode`` requires bytes and ``decode`` returns them.
    With ``validate`` (the default) every object is checked against its schema before it
    is written; fastavro's writer alone catches wrong types, unknown fields and missing
    fields but writes an ``int`` field's out-of-range value without complaint, producing
    bytes other Avro readers reject. ``validate=False`` halves the encode cost.
    Errors: :class:`SchemaNotFoundError` (name not loaded), :class:`PayloadEncodeError`
    (object does not fit the schema), :class:`CorruptRecordError` (bytes are not a record
    of the schema).
    """

    __slots__ = ("_registry", "_validate")

    def __init__(self, registry: SchemaRegistry | None = None, *, validate: bool = True) -> None:
        self._registry = SchemaRegistry.default() if registry is None else registry
        self._validate = validate

    def encode(self, obj: Any, schema: str | None) -> bytes:
        """The Avro body of ``obj`` under ``schema``, or ``obj`` itself when schema is None."""
        if schema is None:
            if isinstance(obj, (bytes, bytearray, memoryview)):
                return bytes(obj)
            raise PayloadEncodeError(
                f"a raw payload (payload_schema None) must be bytes, got {type(obj).__name__}"
            )
        entry = self._registry.get(schema)
        out = BytesIO()
        try:
            if self._validate:
                validate(obj, entry.parsed, raise_errors=True)
            # strict_allow_default: unknown fields, and missing fields without a default, are
            # errors (by default fastavro ignores the former and writes null for the latter).
            schemaless_writer(out, entry.parsed, obj, strict_allow_default=True)
        except Exception as exc:
            raise PayloadEncodeError(f"payload does not fit schema {schema}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return out.getvalue()

    def decode(self, data: bytes, schema: str | None) -> Any:
        """The object ``data`` encodes under ``schema``; raw bytes when schema is None."""
        if schema is None:
            return bytes(data)
        entry = self._registry.get(schema)
        body = BytesIO(data)
        try:
            obj = schemaless_reader(body, entry.parsed, None)
        except Exception as exc:
            raise CorruptRecordError(f"payload is not a valid {schema} record: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if body.tell() != len(data):
            raise CorruptRecordError(f"payload of schema {schema} has "
                                     f"{len(data) - body.tell()} trailing bytes")
        return obj

    def decode_envelope(self, envelope: Envelope) -> Any:
        """The payload of ``envelope`` in its original form (``payload_schema`` decides)."""
        return self.decode(envelope.payload, envelope.payload_schema)
