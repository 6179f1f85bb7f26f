"""Plain Avro values (``PlainFormat.AVRO``) as Spark Column expressions: Step 2 of
:func:`eoguard_spark.plain.decode_plain` for Avro, and the key of an Avro id field.

A consumer reads the same record with confluent-kafka's ``AvroDeserializer`` or fastavro's
``schemaless_reader``; the job reads it with Spark's ``from_avro`` and these rules, so both
refuse and key it alike (connectors/spark/README.md, "Plain topics", says where they differ):

  Step 2a. A null value (a tombstone) is malformed.
  Step 2b. Registry framing: more than 5 bytes, the first the magic byte 0; the schema id
           (the next 4) is skipped, not looked up.
  Step 2c. ``from_avro`` of the body in PERMISSIVE mode (a body it cannot read is a dead
           letter, not a failed batch), told by the reader schema's extra field
           (:func:`eoguard_spark.avro_schema.spark_schemas`).
  Step 2d. Every string of the record valid UTF-8: ``from_avro`` does not check, fastavro does.
"""

from __future__ import annotations

from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, IllegalArgumentException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StructType

from eoguard.errors import ConfigError
from eoguard_spark.avro_schema import (
    AVRO_DECODED,
    AVRO_LIMITS,
    avro_id_type,
    avro_record_schema,
    avro_session_conf,
    spark_schemas,
)
from eoguard_spark.decode import fence
from eoguard_spark.options import AvroFraming, PlainOptions
from eoguard_spark.rules import Rule

__all__ = ["AVRO_COLUMN", "avro_field_key", "check_limits", "with_avro_value"]

AVRO_COLUMN = "_avro"
"""The column of the decoded record (a struct of the reader schema's fields)."""

REGISTRY_HEADER = 5
"""Schema Registry framing: the magic byte 0 and a 4-byte schema id before the body."""


def _has_binary(kind: DataType) -> bool:
    if isinstance(kind, BinaryType):
        return True
    if isinstance(kind, StructType):
        return any(_has_binary(f.dataType) for f in kind.fields)
    if isinstance(kind, ArrayType):
        return _has_binary(kind.elementType)
    if isinstance(kind, MapType):
        return _has_binary(kind.valueType)
    return False


def _texts(col: Column, kind: DataType) -> list[Column]:
    """Text columns holding every string inside ``col`` (of Spark type ``kind``), joined by
    ASCII bytes: valid UTF-8 iff every string in it is (an ASCII byte is a character of its
    own in UTF-8). No lambdas (a projection with one loses whole-stage codegen).

    A part with no bytes in it is cast to text, which writes its strings as they are and its
    numbers, booleans and punctuation in ASCII; a part with bytes (``bytes``, ``fixed``) is
    taken apart: struct fields one by one, arrays through ``getField`` and ``flatten``, map
    keys joined. Strings in a map inside an array that also holds bytes are not reached.
    """
    if not _has_binary(kind):
        return [col.cast("string")]
    if isinstance(kind, StructType):
        return [t for f in kind.fields for t in _texts(col.getField(f.name), f.dataType)]
    if isinstance(kind, MapType):
        return [F.concat_ws(",", F.map_keys(col)),
                *_texts(F.map_values(col), ArrayType(kind.valueType))]
    if isinstance(kind, ArrayType):
        inner = kind.elementType
        if isinstance(inner, StructType):  # an array of structs -> one array per field
            return [t for f in inner.fields
                    for t in _texts(col.getField(f.name), ArrayType(f.dataType))]
        if isinstance(inner, ArrayType):
            return _texts(F.flatten(col), inner)
    return []  # bytes themselves, or maps inside such an array


def with_avro_value(rows: DataFrame, plain: PlainOptions) -> tuple[DataFrame, list[Rule]]:
    """``rows`` with :data:`AVRO_COLUMN`, the record ``from_avro`` read from ``value``, behind a
    :func:`~eoguard_spark.decode.fence` (so it runs once per row), and the rules of Step 2.

    ConfigError when Spark cannot read with the schema (a name or a recursion its Avro parser
    refuses): the query is not built.
    """
    assert plain.avro_schema is not None
    check_limits(rows.sparkSession)
    value = F.col("value")
    schema = avro_record_schema(plain.avro_schema)
    writer, reader = spark_schemas(schema, plain.id_field)
    rules: list[Rule] = [(value.isNull(), F.lit("plain record: the record has no value"))]  # 2a
    body, readable = value, value.isNotNull()
    if plain.avro_framing is AvroFraming.REGISTRY:  # Step 2b.
        body = value.substr(F.lit(REGISTRY_HEADER + 1), F.octet_length(value) - REGISTRY_HEADER)
        # at least one byte of body, as confluent-kafka's AvroDeserializer asks
        short = F.octet_length(value) <= REGISTRY_HEADER
        magic = F.substring(value, 1, 1)
        framed = magic == F.lit(bytearray(b"\x00"))
        rules += [
            (short, F.format_string("plain record: %d bytes, too short for the %d-byte Schema "
                                    "Registry header and a body", F.octet_length(value),
                                    F.lit(REGISTRY_HEADER))),
            (~framed,
             F.concat(F.lit("plain record: bad magic: starts with "), F.lower(F.hex(magic)),
                      F.lit(", expected 00 (Schema Registry framing)"))),
        ]
        readable = readable & ~short & framed
    options = {"mode": "PERMISSIVE", "avroSchema": reader}
    try:  # Step 2c.
        rows = rows.withColumn(AVRO_COLUMN, F.when(readable, from_avro(body, writer, options)))
    except (AnalysisException, IllegalArgumentException, Py4JJavaError) as exc:
        # Avro's Java parser (SchemaParseException) and Spark's converter
        # (IncompatibleSchemaException) reach Python unconverted, as Py4JJavaError
        java = getattr(exc, "java_exception", None)
        words = " ".join(str(exc if java is None else java.toString()).split())
        raise ConfigError(f"plain avro_schema cannot be read by Spark's from_avro: "
                          f"{words[:300]}") from exc
    rows = fence(rows)
    record = F.col(AVRO_COLUMN)
    rules.append((record.getField(AVRO_DECODED).isNull(),
                  F.lit("plain record: the value is not a valid Avro record of avro_schema")))
    kind = rows.schema[AVRO_COLUMN].dataType
    assert isinstance(kind, StructType)
    texts = _texts(record, kind)  # Step 2d.
    if texts:
        valid: Any = F.lit(True)
        for text in texts:
            valid = valid & F.coalesce(F.is_valid_utf8(text), F.lit(True))
        rules.append((~valid, F.lit("plain record: a string of the Avro record is not valid "
                                    "UTF-8")))
    return rows, rules


def check_limits(spark: SparkSession) -> None:
    """ConfigError unless Avro's reader is capped (:data:`AVRO_LIMITS`) in the driver's JVM
    and, off local mode, in the executors' settings: uncapped, one value of a few bytes that
    declares a 2 GiB string exits the JVM (OutOfMemoryError)."""
    wanted = avro_session_conf()["spark.executor.extraJavaOptions"]
    system = spark.sparkContext._jvm.java.lang.System  # type: ignore[union-attr]
    driver = all(system.getProperty(name) for name in AVRO_LIMITS)
    local = (spark.sparkContext.master or "").startswith("local")
    executors = all(f"-D{name}=" in spark.sparkContext.getConf().get(
        "spark.executor.extraJavaOptions", "") for name in AVRO_LIMITS)
    if not (driver and (local or executors)):
        raise ConfigError(
            f"plain Avro values need Avro's reader capped in every JVM, or a few bytes "
            f"declaring a 2 GiB string exit it: start the session with "
            f"spark.driver.extraJavaOptions and spark.executor.extraJavaOptions holding "
            f"{wanted!r} (eoguard_spark.local_session and python -m eoguard_spark do)")


def avro_field_key(plain: PlainOptions) -> tuple[Column, list[Rule]]:
    """The key of the Avro id field as binary (a string's UTF-8, an integer's decimal digits,
    as :func:`eoguard.codec.plain.business_key` says of fastavro's value), and its rule."""
    assert plain.avro_schema is not None
    assert plain.id_field is not None
    name = plain.id_field
    found = F.col(AVRO_COLUMN).getField(name)
    if avro_id_type(avro_record_schema(plain.avro_schema), name) != "string":
        found = found.cast("string")  # int and long are read as long: its decimal digits
    key = found.cast("binary")
    return key, [(key.isNull(), F.lit(f"plain record: id field '{name}' is missing or null"))]
