"""The vectors that pin the Spark job's plain-record ids to the consumer's (issue 35).

A GuardedConsumer keys a plain record with ``id_from_field``/``id_from_header`` of
:mod:`eoguard.codec.plain` (``message_id_for(namespace, business_key(key))``); the Spark job
spells the same as Columns (:func:`eoguard_spark.plain.message_id_column`). The unit test pins
the consumer's rules to the literal ids below, the Spark test pins the job's to the same.

Numbers as keys: an integer field's key is its decimal digits, so ``42`` and ``"42"`` are one
key; a float, a bool or null is no key (the consumer refuses it, the job's options refuse a
field of such a type).
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
