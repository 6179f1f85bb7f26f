"""The reader schema of plain Avro values (``PlainFormat.AVRO``): checked at option time with
fastavro, and the two forms the job gives Spark's ``from_avro`` (:mod:`eoguard_spark.plain_avro`).

Pure Python (no pyspark), so the options are checked without Spark.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException

from eoguard.codec.rules import InputLimits
from eoguard.errors import ConfigError

__all__ = ["AVRO_DECODED", "AVRO_LIMITS", "avro_id_type", "avro_record_schema",
           "avro_session_conf", "spark_schemas"]

AVRO_DECODED = "_eoguard_decoded"
"""The field the job adds to the reader schema to tell a body ``from_avro`` could not read
(:func:`spark_schemas`); a schema may not have a field of that name."""

_ID_TYPES = ("string", "int", "long")

AVRO_LIMITS = ("org.apache.avro.limits.string.maxLength",
               "org.apache.avro.limits.bytes.maxLength",
               "org.apache.avro.limits.collectionItems.maxLength")
"""The JVM system properties that cap what Avro's Java reader allocates for one declared
length (a string, bytes, an array or map block). Without them a 7-byte value declaring a
string of 2 GiB is an OutOfMemoryError, which ``from_avro``'s PERMISSIVE mode does not
catch: the JVM exits. With them the reader raises, and the row is a dead letter."""


def avro_session_conf(limit: int = InputLimits().payload_bytes) -> dict[str, str]:
    """The Spark settings that set :data:`AVRO_LIMITS` to ``limit`` (bytes or items; by
    default the largest value the job reads: no string or block of such a value is longer) in
    the driver's and the executors' JVMs. Given before the session starts; a session of your
    own needs the same ``extraJavaOptions`` (appended to any you have)."""
    options = " ".join(f"-D{name}={limit}" for name in AVRO_LIMITS)
    return {"spark.driver.extraJavaOptions": options, "spark.executor.extraJavaOptions": options}


def avro_record_schema(text: object) -> dict[str, Any]:
    """The Avro record schema whose JSON is ``text``, checked by ``fastavro.parse_schema``
    (the parser of a consumer's fastavro or confluent-kafka deserializer); ConfigError
    otherwise. Spark's Avro parser is stricter (names, duplicate fields): what it refuses is
    a ConfigError when the query is built."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"plain avro_schema must be the JSON of an Avro schema, got {text!r}")
    try:
        schema = json.loads(text)
        fastavro.parse_schema(schema)
    except (ValueError, TypeError, KeyError, AttributeError, SchemaParseException) as exc:
        raise ConfigError(f"plain avro_schema is not a valid Avro schema: "
                          f"{type(exc).__name__}: {exc}") from exc
    if (not isinstance(schema, dict) or schema.get("type") != "record"
            or not isinstance(schema.get("fields"), list)):
        raise ConfigError("plain avro_schema must be an Avro record schema (type record, "
                          "with fields)")
    if any(str(f.get("name")).lower() == AVRO_DECODED for f in schema["fields"]):
        raise ConfigError(f"plain avro_schema has a field {AVRO_DECODED!r}: the job adds one "
                          f"of that name to tell an unreadable body")
    _check_spark_names(schema)
    out: dict[str, Any] = schema
    return out


def _check_spark_names(kind: Any) -> None:
    """ConfigError for what fastavro and Spark's parser accept but ``from_avro`` fails on every
    record of (a dead letter each): in any record, two fields whose names differ only in case
    (Spark matches fields to columns ignoring case), or an alias that is another field's name
    or alias (the job's reader schema resolves aliases against the writer's)."""
    if isinstance(kind, list):
        for branch in kind:
            _check_spark_names(branch)
        return
    if not isinstance(kind, dict):
        return
    if kind.get("type") == "record":
        seen: dict[str, str] = {}
        for fld in kind.get("fields", []):
            names = [fld["name"], *fld.get("aliases", [])]
            for name in names:
                other = seen.setdefault(str(name).lower(), fld["name"])
                if other != fld["name"] or names.count(name) > 1:
                    raise ConfigError(
                        f"plain avro_schema record {kind.get('name')!r}: {name!r} of field "
                        f"{fld['name']!r} clashes with field {other!r} (names and aliases "
                        f"must differ beyond case: Spark's from_avro matches them ignoring "
                        f"case)")
            _check_spark_names(fld.get("type"))
        return
    for key in ("items", "values", "type"):
        if key in kind:
            _check_spark_names(kind[key])


def avro_id_type(schema: dict[str, Any], name: str) -> str:
    """The Avro type of the top-level id field ``name``: ``string``, ``int`` or ``long``, maybe
    in a union with null; else ConfigError. A consumer's ``id_from_field`` over fastavro's
    value keys just these (text; an integer as its digits), not a logical type fastavro
    converts (a ``uuid`` string becomes a ``uuid.UUID``: no key)."""
    found = [f["type"] for f in schema["fields"] if f.get("name") == name]
    if not found:
        raise ConfigError(f"plain id_field {name!r} is not a top-level field of avro_schema")
    kind = found[0]
    branches = [b for b in kind if b != "null"] if isinstance(kind, list) else [kind]
    named = branches[0] if len(branches) == 1 else None
    if isinstance(named, dict):
        if "logicalType" in named:
            raise ConfigError(
                f"plain id_field {name!r} has logicalType {named['logicalType']!r}: fastavro "
                f"converts it, and a consumer's id_from_field takes no such key; give the "
                f"reader schema without the logicalType (the bytes are the same)")
        named = named.get("type")
    if named not in _ID_TYPES:
        raise ConfigError(f"plain id_field {name!r} is {json.dumps(kind)}: a key is a string, "
                          f"int or long (or a union of null and one of them)")
    return str(named)


def _as_long(kind: Any) -> Any:
    """An ``int`` id field's type read as ``long`` (a union's branch, or a type object's)."""
    if isinstance(kind, list):
        return [_as_long(b) for b in kind]
    if isinstance(kind, dict):
        return {**kind, "type": _as_long(kind["type"])}
    return "long" if kind == "int" else kind


def spark_schemas(schema: dict[str, Any], id_field: str | None) -> tuple[str, str]:
    """The writer and reader schema JSON for ``from_avro(body, writer, {"avroSchema": reader})``.

    - An ``int`` id field is read as ``long``: the two share one encoding (a zigzag varint),
      and fastavro reads either as a Python int of up to 64 bits, where Avro's Java reader
      refuses an int varint over 5 bytes and keeps the low 32 bits of a 5-byte one; as a long
      the job's key is the consumer's for every varint both can read.
    - The reader adds ``_eoguard_decoded: boolean = true``. Schema resolution fills it in on
      every body that decodes; on a body that does not, ``from_avro`` in PERMISSIVE mode gives
      a row of nulls, so a null there is an unreadable body, whatever fields the schema lets
      be null.
    """
    writer = copy.deepcopy(schema)
    if id_field is not None:
        for fld in writer["fields"]:
            if fld.get("name") == id_field:
                fld["type"] = _as_long(fld["type"])
    reader = copy.deepcopy(writer)
    reader["fields"].append({"name": AVRO_DECODED, "type": "boolean", "default": True})
    return json.dumps(writer), json.dumps(reader)
