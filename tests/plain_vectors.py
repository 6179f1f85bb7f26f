"""The vectors that pin the Spark job's plain-record ids to the consumer's (issue 35).

A GuardedConsumer keys a plain record with ``id_from_field``/``id_from_header`` of
:mod:`eoguard.codec.plain` (``message_id_for(namespace, business_key(key))``); the Spark job
spells the same as Columns (:func:`eoguard_spark.plain.message_id_column`). The unit test pins
the consumer's rules to the literal ids below, the Spark test pins the job's to the same.

Numbers as keys: an integer field's key is its decimal digits, so ``42`` and ``"42"`` are one
key; a float, a bool or null is no key (the consumer refuses it, the job's options refuse a
field of such a type). Avro bodies below: what fastavro (a consumer's deserializer) and Spark's
``from_avro`` (the job's) read from the same bytes, hostile ones included.
"""

from __future__ import annotations

NAMESPACE = "orders"

TEXT_KEYS = {
    "o-1": "ee6d8a94-8180-5fad-a5ce-c8eb86830f70",
    "Bestellung-\u00fc\U0001f600": "6d2a592d-3e98-5145-8611-6fd143a5a0b2",
    "": "124666fb-ddb0-5b48-b328-7c54f4bc5e9e",
    "a|b{c}": "9b22be8b-5042-5353-8466-05655dc27377",
    "42": "d53f8e15-ebb2-5365-a7a5-f9fcc6122318",
}
"""Text keys of a JSON ``string`` field: ASCII, non-ASCII and outside the BMP, empty,
key punctuation, digits (the same id as the integer 42)."""

INT_KEYS = {
    42: "d53f8e15-ebb2-5365-a7a5-f9fcc6122318",
    0: "81e28214-9b50-5c8c-84c2-0d87047658d8",
    -7: "61971a3d-e718-51a2-a651-09be6b04b0e6",
    2**62: "9e16b95f-2bfa-5d85-9c4a-60ec487f2f14",
}
"""Integer keys of a JSON ``bigint`` field (their decimal digits)."""

HEADER_KEYS = {
    b"o-1": "ee6d8a94-8180-5fad-a5ce-c8eb86830f70",
    "\u00fc".encode(): "595ac03d-dc5c-5796-a505-77cbf47add55",
    b"\xff\x00binary": "67b17344-c6ed-59ef-bdaf-16da10f7cced",
    b"": "124666fb-ddb0-5b48-b328-7c54f4bc5e9e",
}
"""Header values (bytes, hashed as they are): text, UTF-8, not UTF-8, empty."""


def avro_order_schema(id_type: str) -> dict[str, object]:
    """The Avro record of the vectors below: ``order_id`` of ``id_type`` (``null|long`` is the
    union ``["null", "long"]``), then ``note``, an optional string."""
    kind: object = id_type.split("|") if "|" in id_type else id_type
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "order_id", "type": kind}, {"name": "note", "type": ["null", "string"]}]}


AVRO_BODIES = {
    ("string", "066f2d3100"): "ee6d8a94-8180-5fad-a5ce-c8eb86830f70",
    ("string", "0000"): "124666fb-ddb0-5b48-b328-7c54f4bc5e9e",
    ("string", "06c3bc2000"): "80860636-986f-50b5-8a31-1a96d1f4e0da",
    ("string", "066f2d3102026100"): "ee6d8a94-8180-5fad-a5ce-c8eb86830f70",
    ("string", "066f2d3102026100ff"): "ee6d8a94-8180-5fad-a5ce-c8eb86830f70",
    ("long", "5400"): "d53f8e15-ebb2-5365-a7a5-f9fcc6122318",
    ("int", "5400"): "d53f8e15-ebb2-5365-a7a5-f9fcc6122318",
    ("null|long", "025400"): "d53f8e15-ebb2-5365-a7a5-f9fcc6122318",
    ("long", "0d00"): "61971a3d-e718-51a2-a651-09be6b04b0e6",
    ("int", "ffffffff0f00"): "edf56b0d-c04d-51d6-ae72-370df4050419",
    ("int", "ffffffff7f00"): "1b1d3944-3c29-554f-93e7-9ba91e1ea1a1",
    ("null|int", "02ffffffff7f00"): "1b1d3944-3c29-554f-93e7-9ba91e1ea1a1",
    ("long", "feffffffffffffffff0100"): "4324b11d-137f-5b6a-9e00-aa416fbf120b",
    ("long", "ffffffffffffffffff7f00"): "82f654b1-4dfc-5350-a578-1f2644bacef1",
}
"""Avro bodies (no framing) of :func:`avro_order_schema` and the id both a consumer
(fastavro + ``id_from_field(NAMESPACE, "order_id")``) and the job compute: ``o-1``, empty,
``"ü "``, with a note, with a byte after the record (ignored by both), 42 as long, int and
nullable long (the same id as ``"42"``), -7, the int extremes, a 5-byte int varint over 32
bits (-17179869184: fastavro reads it whole; the job reads an int id as a long to agree), the
long extremes (the high bits of a 10th varint byte dropped by both)."""

AVRO_REFUSED = {
    ("null|long", "0000"): "plain record: id field 'order_id' is missing or null",
    ("string", "02ff00"): "plain record: a string of the Avro record is not valid UTF-8",
    ("string", "04eda08000"): "plain record: a string of the Avro record is not valid UTF-8",
    ("string", "066f2d310202ff"): "plain record: a string of the Avro record is not valid UTF-8",
    ("string", "066f2d3102"): "plain record: the value is not a valid Avro record of avro_schema",
    ("long", ""): "plain record: the value is not a valid Avro record of avro_schema",
}
"""Bodies both refuse, with the job's reason: a null id, invalid UTF-8 in the id (a lone byte,
an encoded surrogate) or in another string, a truncated body, an empty one."""

AVRO_CONSUMER_ONLY = {
    ("long", "ffffffffffffffffffff0100"): "82f654b1-4dfc-5350-a578-1f2644bacef1",
    ("null|long", "015400"): "d53f8e15-ebb2-5365-a7a5-f9fcc6122318",
}
"""Bodies fastavro reads (the id a consumer computes) and Avro's Java reader in the job does
not (a dead letter, the value not a valid record): an 11-byte varint, and a union index of -1
(fastavro takes the last branch, as a Python index; a negative enum index likewise)."""
