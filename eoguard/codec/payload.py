"""Application payloads: Avro binary bodies of the application's own schemas, or raw bytes.

The envelope names the payload's schema (``payload_schema``, a full name from
``schemas/``) and, since envelope version 3, the exact version that wrote it
(``payload_fingerprint``), so the payload itself is the bare Avro body. A reader decodes it
into the *current* version of that name, resolving the writer's version by Avro's rules
(fields added with a default get it, removed fields are skipped), so an application that
moved to a newer schema still reads what older producers wrote. Older versions are found
by fingerprint among ``schemas/history/``. Decoding uses the schema's logical types, so the
handler gets back the form the application sent: ``datetime`` for timestamp-millis,
``Decimal`` for decimal, ``UUID`` for uuid.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import validate

from eoguard.codec.schemas import SchemaRegistry
from eoguard.envelope import Envelope
from eoguard.errors import CorruptRecordError, PayloadEncodeError, UnknownFingerprintError

__all__ = ["PayloadCodec"]


class PayloadCodec:
    """Encode application objects with a named schema from the registry, and back.

    ``schema=None`` means raw bytes: ``encode`` requires bytes and ``decode`` returns them.
    With ``validate`` (the default) every object is checked against its schema before it
    is written; fastavro's writer alone catches wrong types, unknown fields and missing
    fields but writes an ``int`` field's out-of-range value without complaint, producing
    bytes other Avro readers reject. ``validate=False`` halves the encode cost.
    Errors: :class:`SchemaNotFoundError` (name not loaded), :class:`PayloadEncodeError`
    (object does not fit the schema), :class:`UnknownFingerprintError` (the writer version
    is not loaded, or is another schema), :class:`CorruptRecordError` (bytes are not a record
    of the schema, or the writer version does not resolve to the current one).
    """

    __slots__ = ("_readers", "_registry", "_validate")

    def __init__(self, registry: SchemaRegistry | None = None, *, validate: bool = True) -> None:
        self._registry = SchemaRegistry.default() if registry is None else registry
        self._validate = validate
        # (name, writer fingerprint) -> (writer schema, reader schema or None when current)
        self._readers: dict[tuple[str, bytes | None], tuple[Any, Any]] = {}

    def writer_fingerprint(self, schema: str | None) -> bytes | None:
        """The fingerprint :meth:`encode` writes with (the current version of ``schema``)."""
        return None if schema is None else self._registry.get(schema).fingerprint

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

    def decode(self, data: bytes, schema: str | None, writer: bytes | None = None) -> Any:
        """The object ``data`` encodes under ``schema``, in its current version; raw bytes
        when schema is None. ``writer`` is the fingerprint of the version that wrote it
        (``None``: the current version, as envelopes before version 3 imply)."""
        if schema is None:
            return bytes(data)
        pair = self._readers.get((schema, writer))
        if pair is None:
            pair = self._resolve(schema, writer)
        body = BytesIO(data)
        try:
            obj = schemaless_reader(body, pair[0], pair[1])
        except Exception as exc:
            raise CorruptRecordError(f"payload is not a valid {schema} record: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if body.tell() != len(data):
            raise CorruptRecordError(f"payload of schema {schema} has "
                                     f"{len(data) - body.tell()} trailing bytes")
        return obj

    def decode_envelope(self, envelope: Envelope) -> Any:
        """The payload of ``envelope`` in its original form (``payload_schema`` decides)."""
        return self.decode(envelope.payload, envelope.payload_schema,
                           envelope.payload_fingerprint)

    def _resolve(self, schema: str, writer: bytes | None) -> tuple[Any, Any]:
        """Writer and reader schemas for payloads of ``schema`` written by ``writer``."""
        current = self._registry.get(schema)
        if writer is None or writer == current.fingerprint:
            pair: tuple[Any, Any] = (current.parsed, None)
        else:
            try:
                entry = self._registry.by_fingerprint(writer)
            except UnknownFingerprintError:
                raise UnknownFingerprintError(
                    f"payload writer schema {writer.hex()} ({schema}) is not loaded: add that "
                    f"version to the schemas' history/", fingerprint=writer) from None
            if entry.name != schema:
                raise UnknownFingerprintError(
                    f"payload writer fingerprint {writer.hex()} is schema {entry.name}, "
                    f"not {schema}", fingerprint=writer)
            pair = (entry.parsed, current.parsed)
        self._readers[schema, writer] = pair
        return pair
