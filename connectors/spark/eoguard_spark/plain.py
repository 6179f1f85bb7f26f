"""Plain records (not envelopes) as Spark Column expressions (docs/design.md §6, "Plain topics").

A GuardedConsumer given ``PlainRecords`` and the job given :class:`PlainOptions` read a topic
the same way: a record is an envelope iff :class:`eoguard.codec.plain.EnvelopeHeads` holds its
first 10 bytes; every other record is plain and keyed by the application's rules. Per plain row:

  Step 1. Size: a value over ``payload_bytes`` is malformed.
  Step 2. The value: JSON read with ``json_schema`` (invalid UTF-8 or JSON is malformed), Avro
          read with ``avro_schema`` (:mod:`eoguard_spark.plain_avro`), or raw.
  Step 3. The id: ``message_id_for(id_namespace, key)`` as Columns, the key from a JSON or
          Avro field (text, or an integer as its decimal digits:
          :func:`eoguard.codec.plain.business_key`) or a header's bytes (its last value); a
          missing or null key is malformed.
  Step 4. The lifetime: the Kafka timestamp plus ``ttl_s``; beyond now + ``max_ttl`` is
          malformed, passed at the micro-batch's timestamp is expired.

The rows have the envelope decode's columns (:data:`eoguard_spark.decode.OUTPUT_COLUMNS`, with
``producer`` empty, ``attempt`` 1, ``payload`` the raw value and ``headers`` empty), so the
dedup, sinks and dead letters after the decode do not know which kind a row was.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from eoguard.codec import InputLimits, SchemaRegistry
from eoguard.codec.plain import EnvelopeHeads
from eoguard.envelope import namespace_uuid
from eoguard.store.keys import DEFAULT_MAX_TTL_MS
from eoguard_spark.decode import RowStatus, decode
from eoguard_spark.header_format import HeaderPlan, decode_headers, has_marker
from eoguard_spark.options import PlainFormat, PlainOptions
from eoguard_spark.plain_avro import avro_field_key, with_avro_value
from eoguard_spark.rules import Rule, first_broken

__all__ = ["decode_topic", "is_envelope", "message_id_column"]

_CORRUPT = "_eoguard_corrupt"
_VARIANT = ("0123456789abcdef", "89ab89ab89ab89ab")  # the high nibble of byte 8: (n & 3) | 8


def is_envelope(value: Column, registry: SchemaRegistry) -> Column:
    """Whether a row's value is read as an envelope: :meth:`EnvelopeHeads.holds`, as a Column."""
    head = F.substring(value, 1, 10)
    out = F.lit(False)
    for known in sorted(EnvelopeHeads(registry).heads):
        out = out | (head == F.lit(bytearray(known)))
    return value.isNotNull() & out


def message_id_column(namespace: str, key: Column) -> Column:
    """:func:`eoguard.envelope.message_id_for` of ``namespace`` and ``key`` (binary) as a
    Column: the SHA-1 of the namespace's UUID and the key, version 5 and the RFC 9562 variant
    set, as lowercase hyphenated text."""
    h = F.sha1(F.concat(F.lit(bytearray(namespace_uuid(namespace).bytes)), key))
    return F.concat(
        h.substr(1, 8), F.lit("-"), h.substr(9, 4), F.lit("-5"), h.substr(14, 3), F.lit("-"),
        F.translate(h.substr(17, 1), *_VARIANT), h.substr(18, 3), F.lit("-"), h.substr(21, 12))


_INTEGRAL = r"^(BIGINT|INT|SMALLINT|TINYINT|DECIMAL\(\d+,0\))$"


def _field_key(text: Column, field: str) -> tuple[Column, list[Rule]]:
    """The key of a JSON field as binary, and the rules it must pass: present and not null,
    text (its UTF-8) or an integer (its decimal digits), as
    :func:`eoguard.codec.plain.business_key` says.

    The type comes from the value parsed as a VARIANT, which reads ``4.0`` as the integer 4:
    the field's JSON text (``get_json_object``) must also be digits, or it is a float to the
    consumer's ``json.loads`` and no key.
    """
    found = F.try_variant_get(F.try_parse_json(text), f"$.{field}", "variant")
    kind = F.schema_of_variant(found)
    digits = F.get_json_object(text, f"$.{field}").rlike(r"^-?[0-9]+$")
    key = F.when(kind == "STRING", found.cast("string")).when(
        kind.rlike(_INTEGRAL) & digits, found.cast("string"))
    return key.cast("binary"), [
        (found.isNull() | (kind == "VOID"),
         F.lit(f"plain record: id field '{field}' is missing or null")),
        (key.isNull(), F.concat(F.lit(f"plain record: id field '{field}' is "),
                                F.lower(kind), F.lit(", not text or an integer")))]


def _header_key(name: str) -> tuple[Column, list[Rule]]:
    """The bytes of the header's last value (a header without a value does not count)."""
    found = F.filter(F.col("headers"), lambda h: (h.getField("key") == F.lit(name))
                     & h.getField("value").isNotNull())
    # try_element_at: under ANSI mode (Spark 4's default) element_at of an empty array fails
    key = F.try_element_at(found, F.lit(-1)).getField("value")
    return key, [(key.isNull(), F.lit(f"plain record: no header '{name}' (the id's key)"))]


def decode_plain(raw: DataFrame, plain: PlainOptions, *, max_ttl_ms: int,
                 limits: InputLimits) -> DataFrame:
    """Kafka source rows of plain records -> the decode's output rows (module docstring)."""
    value = F.col("value")
    rows = raw.select("*", F.col("timestamp").alias("kafka_timestamp"))
    rules: list[Rule] = [  # Step 1.
        (F.coalesce(F.octet_length(value), F.lit(0)) > limits.payload_bytes,
         F.format_string("plain record: value is %d bytes, over %d", F.octet_length(value),
                         F.lit(limits.payload_bytes)))]
    text = value.cast("string")
    if plain.format is PlainFormat.JSON:  # Step 2.
        invalid = value.isNull() | ~F.is_valid_utf8(value) | F.try_parse_json(text).isNull()
        if plain.json_schema is not None:
            parsed = F.from_json(text, f"{plain.json_schema}, {_CORRUPT} string",
                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
            invalid = invalid | parsed.getField(_CORRUPT).isNotNull()
        rules.append((invalid, F.lit("plain record: the value is not valid JSON"
                                     + (" of json_schema" if plain.json_schema else ""))))
    elif plain.format is PlainFormat.AVRO:
        rows, avro_rules = with_avro_value(rows, plain)
        rules.extend(avro_rules)
    if plain.id_field is not None and plain.format is PlainFormat.AVRO:  # Step 3.
        key, key_rules = avro_field_key(plain)
    elif plain.id_field is not None:
        key, key_rules = _field_key(text, plain.id_field)
    else:
        assert plain.id_header is not None
        key, key_rules = _header_key(plain.id_header)
    rows = rows.withColumn("_key", key)
    rules.extend(key_rules)
    ts_ms = F.unix_millis(F.col("kafka_timestamp"))  # Step 4.
    rules.append((ts_ms.isNull(), F.lit("plain record: the record has no timestamp")))
    expires_ms = ts_ms + F.lit(int(plain.ttl_s * 1000))
    now_ms = F.unix_millis(F.current_timestamp())  # the micro-batch's: the same on a replay
    rules.append((expires_ms > now_ms + F.lit(max_ttl_ms + limits.clock_skew_ms),
                  F.format_string("expires_at %d is beyond now + max_ttl (%d + %d ms)",
                                  expires_ms, now_ms, F.lit(max_ttl_ms))))
    rows = rows.withColumn("reason", first_broken(rules))
    status = (F.when(F.col("reason").isNotNull(), F.lit(RowStatus.MALFORMED.value))
              .when(expires_ms <= now_ms, F.lit(RowStatus.EXPIRED.value))
              .otherwise(F.lit(RowStatus.OK.value)))
    rows = rows.withColumn("status", status)
    valid = F.col("status") != RowStatus.MALFORMED.value
    expires_at = F.when(valid, F.timestamp_millis(expires_ms))
    expired_reason = F.concat(F.lit("expired at "),
                              F.date_format(expires_at, "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"))
    return rows.select(
        F.when(valid, message_id_column(plain.id_namespace, F.col("_key"))).alias("id"),
        expires_at.alias("expires_at"),
        F.when(valid, expires_ms).alias("expires_at_ms"),
        F.when(valid, F.col("kafka_timestamp")).alias("created_at"),
        F.lit("").alias("producer"),
        F.lit(1).alias("attempt"),
        F.lit(None).cast("string").alias("payload_schema"),
        F.when(valid, value).alias("payload"),
        F.create_map().cast("map<string,string>").alias("headers"),
        "key", "topic", "partition", "offset", "kafka_timestamp",
        F.when(F.col("status") != RowStatus.OK.value, value).alias("value"),
        "status",
        F.when(F.col("status") == RowStatus.EXPIRED.value, expired_reason)
        .otherwise(F.col("reason")).alias("reason"),
    )


def decode_topic(raw: DataFrame, registry: SchemaRegistry, *, plain: PlainOptions | None = None,
                 payload_schema: str | None = None, max_ttl_ms: int = DEFAULT_MAX_TTL_MS,
                 limits: InputLimits | None = None, header_plan: HeaderPlan | None = None
                 ) -> DataFrame:
    """:func:`eoguard_spark.decode.decode`, and with ``plain`` its records that are not
    envelopes decoded by :func:`decode_plain` into the same columns (one frame, both kinds);
    with ``header_plan`` (the source reads headers) records in the header format first, by
    :func:`eoguard_spark.header_format.decode_headers`.

    The kinds are filters of one source: Spark reads a micro-batch's Kafka rows once per
    branch (correctness first; a single pass is left for later).
    """
    limits = InputLimits() if limits is None else limits
    if header_plan is not None:
        marked = has_marker(F.col("headers"))
        headed = decode_headers(raw.filter(marked), header_plan, registry,
                                payload_schema=payload_schema, max_ttl_ms=max_ttl_ms,
                                limits=limits)
        others = decode_topic(raw.filter(~marked), registry, plain=plain,
                              payload_schema=payload_schema, max_ttl_ms=max_ttl_ms,
                              limits=limits)
        headed = headed.select(*[F.col(f.name).cast(f.dataType) for f in others.schema])
        return others.unionByName(headed)
    if plain is None:
        return decode(raw, registry, payload_schema=payload_schema, max_ttl_ms=max_ttl_ms,
                      limits=limits)
    envelope = is_envelope(F.col("value"), registry)
    envelopes = decode(raw.filter(envelope), registry, payload_schema=payload_schema,
                       max_ttl_ms=max_ttl_ms, limits=limits)
    plains = decode_plain(raw.filter(~envelope), plain, max_ttl_ms=max_ttl_ms, limits=limits)
    plains = plains.select(*[F.col(f.name).cast(f.dataType) for f in envelopes.schema])
    return envelopes.unionByName(plains)
