"""Avro codec: the envelope as single-object encoded Kafka values, payloads, schemas."""

from eoguard.codec.envelope_codec import ENVELOPE_SCHEMA, HEADER_SIZE, MAGIC, EnvelopeCodec
from eoguard.codec.payload import PayloadCodec
from eoguard.codec.plain import EnvelopeHeads, Lifetime, PlainRecord, PlainRecords, read_plain
from eoguard.codec.rules import InputLimits, check_envelope
from eoguard.codec.schemas import RegisteredSchema, SchemaRegistry, fingerprint_of

__all__ = [
    "ENVELOPE_SCHEMA",
    "HEADER_SIZE",
    "MAGIC",
    "EnvelopeCodec",
    "EnvelopeHeads",
    "InputLimits",
    "Lifetime",
    "PayloadCodec",
    "PlainRecord",
    "PlainRecords",
    "RegisteredSchema",
    "SchemaRegistry",
    "check_envelope",
    "fingerprint_of",
    "read_plain",
]
