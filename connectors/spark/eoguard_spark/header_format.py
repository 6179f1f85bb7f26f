"""Records in the header wire format as Spark Column expressions (docs/design.md §3, "The
header format"; §7).

The value is what a Schema Registry serializer writes (or raw bytes); eoguard's fields are
Kafka headers (the source's ``includeHeaders``). Per row, as a GuardedConsumer reads it
(:mod:`eoguard.codec.headers`), with the same reasons in the same order:

  Step 1. Which rows: those with a ``ce_eoguardattempt`` header (any letter case):
          :func:`has_marker`; :func:`eoguard_spark.plain.decode_topic` sends them here.
  Step 2. eoguard's headers, each judged in the consumer's order: once, with a value,
          UTF-8; none missing; ``ce_specversion`` 1.0; the attempt a whole number from 1 to
          2^31-1; ``ce_time`` and ``ce_expirytime`` RFC 3339 (read as epoch ms by
          arithmetic, no timestamp parser: an absurd time is a number the rules refuse).
  Step 3. The input rules of an envelope (:mod:`eoguard_spark.rules`) on those fields.
  Step 4. The payload, ``content-type: application/avro``: more than 5 bytes and the magic
          byte 0; the schema id one of the query's :class:`HeaderPlan`; ``from_avro`` of
          the body with that writer schema, resolved into ``payload_schema`` when it is
          given (the output is then the reader's struct), else into the reader's version of
          the writer's name, only to judge the body (the output keeps the raw value). Any
          other content type: the value is the payload, raw.
  Step 5. Classify as the envelope decode does; Step 4's rules only for a row not expired
          (a consumer drops an expired record before reading its payload).

A schema id the plan does not hold (registered after the query started) stops the
micro-batch with :data:`NEW_SCHEMA_ID` in the error before anything of it is committed (a
``raise_error`` in the decode: the batch fails as a failed task does, and its replay re-owns
its claims); :func:`eoguard_spark.job.run` builds the query again with a plan that holds it
and the replay reads the record. An id the registry does not have when the plan is made is a
dead letter, as for a consumer. A valid record is never dead-lettered for its id being new.
A query without a registry (``HeaderPlan(registry=False)``: raw payloads only) stops the same
way at a framed payload, with :data:`NEEDS_REGISTRY`, and ``run`` raises a ``ConfigError``
naming the option.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, IllegalArgumentException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.avro.functions import from_avro

from eoguard.codec import InputLimits, SchemaRegistry
from eoguard.codec.headers import (
    ATTEMPT,
    AVRO_CONTENT_TYPE,
    CONTENT_TYPE,
    EXPIRY_TIME,
    ID,
    MARKER,
    PRODUCER,
    REQUIRED,
    RESERVED,
    SPEC_VERSION,
    TIME,
)
from eoguard.codec.registry_payloads import FRAME_SIZE, fetch_refusal, subject_for
from eoguard.codec.schemas import RegisteredSchema
from eoguard.errors import ConfigError, UnknownSchemaIdError
from eoguard_spark.decode import classify, fence
from eoguard_spark.plain_avro import check_limits
from eoguard_spark.rules import Rule, canonical_id, envelope_rules, first_broken

__all__ = ["NEEDS_REGISTRY", "NEW_SCHEMA_ID", "HeaderPlan", "decode_headers", "has_marker",
           "header_envelope", "header_payload", "needs_registry", "new_schema_ids",
           "plan_from_registry"]

log = logging.getLogger(__name__)

NEW_SCHEMA_ID = "eoguard: schema id new to this query:"
"""What the error that stops a micro-batch meeting a new schema id says, before the id."""
_NEW_ID = re.compile(re.escape(NEW_SCHEMA_ID) + r" (\d+)")

_DATE = r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
_TIME = rf"^{_DATE}(?:\.([0-9]{{1,9}}))?(?:([Zz])|([+-])([0-9]{{2}}):([0-9]{{2}}))\z"
""":func:`eoguard.codec.headers.parse_time`'s pattern, anchored for Java."""


NEEDS_REGISTRY = "eoguard: an Avro payload in the header format and no schema_registry_url"
"""What the error that stops a micro-batch meeting a registry-framed payload without a
registry says (:func:`needs_registry`)."""


@dataclass(frozen=True, slots=True)
class HeaderPlan:
    """The writer schemas a query decodes by id, fixed when it starts: ``writers`` (id ->
    schema JSON) and ``refused`` (id -> the reason its records are dead letters: not in the
    registry, not Avro). ``registry`` False: the query has no Schema Registry (raw payloads
    only; a framed one stops it, :data:`NEEDS_REGISTRY`)."""

    writers: dict[int, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    registry: bool = True


def plan_from_registry(client: Any, topics: tuple[str, ...], seen: tuple[int, ...] = ()
                       ) -> HeaderPlan:
    """Every version registered under each topic's subject (``<topic>-value``) and each id in
    ``seen`` (ids a stopped batch met), fetched from Schema Registry now. An id the registry
    answers for with anything but an outage (404, or 400/422) is refused, its records dead
    letters, as a consumer reads the same answer (:func:`fetch_refusal`); an outage is a
    :class:`ConfigError` (the query does not start)."""
    writers: dict[int, str] = {}
    refused: dict[int, str] = {}
    for topic in topics:
        subject = subject_for(topic)
        try:
            versions = client.get_versions(subject)
        except Exception as exc:
            if getattr(exc, "http_status_code", None) == 404:
                continue  # nothing registered yet: ids come as they are met
            raise ConfigError(f"Schema Registry failed listing {subject}: {exc}") from exc
        for version in versions:
            registered = client.get_version(subject, version)
            writers[int(registered.schema_id)] = registered.schema.schema_str
    for schema_id in seen:
        if schema_id in writers:
            continue
        try:
            fetched = client.get_schema(schema_id)
        except Exception as exc:
            refusal = fetch_refusal(exc, schema_id)  # the consumer's reading of the answer
            if not isinstance(refusal, UnknownSchemaIdError):  # an outage, at query start
                raise ConfigError(f"Schema Registry failed fetching schema id {schema_id}: "
                                  f"{exc}") from exc
            refused[schema_id] = str(refusal)
            continue
        writers[schema_id] = fetched.schema_str
    for schema_id, text in list(writers.items()):
        try:
            RegisteredSchema.from_json(json.loads(text))
        except (ValueError, ConfigError) as exc:
            del writers[schema_id]
            refused[schema_id] = (f"schema id {schema_id} is not a named Avro schema eoguard "
                                  f"reads: {exc}")
    return HeaderPlan(writers, refused)


def needs_registry(error: BaseException) -> bool:
    """Whether a query failed on a registry-framed payload while it had no registry."""
    return NEEDS_REGISTRY in str(error)


def new_schema_ids(error: BaseException) -> tuple[int, ...]:
    """The schema ids a query's failure names as new to it (:data:`NEW_SCHEMA_ID`); empty
    when it failed for another reason."""
    return tuple(sorted({int(m) for m in _NEW_ID.findall(str(error))}))


def _values(name: str) -> Column:
    """The values of the headers called ``name`` in any letter case, in order."""
    return F.transform(
        F.filter(F.col("headers"), lambda h: F.lower(h.getField("key")) == F.lit(name)),
        lambda h: h.getField("value"))


def has_marker(headers: Column) -> Column:
    """Step 1: the row carries the header format's marker."""
    return F.coalesce(F.exists(headers, lambda h: F.lower(h.getField("key")) == F.lit(MARKER)),
                      F.lit(False))


def _malformed(text: Column | str) -> Column:
    return F.concat(F.lit("header format: "), F.lit(text) if isinstance(text, str) else text)


def _epoch_ms(text: Column) -> tuple[Column, Column]:
    """(epoch ms, whether ``text`` is an RFC 3339 time :func:`parse_time` reads)."""
    def group(i: int) -> Column:
        return F.regexp_extract(text, _TIME, i)

    def number(i: int) -> Column:
        return F.when(group(i) != "", group(i).cast("long"))

    year, month, day, hour, minute, second = (number(i) for i in range(1, 7))
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month_days = F.element_at(F.array(*[F.lit(n) for n in (31, 28, 31, 30, 31, 30, 31, 31, 30,
                                                           31, 30, 31)]),
                              F.when((month >= 1) & (month <= 12), month.cast("int"))
                              .otherwise(F.lit(1)))
    last_day = month_days + F.when(leap & (month == 2), 1).otherwise(0)
    offset_h, offset_m = number(10), number(11)
    valid = (text.rlike(_TIME) & (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1)
             & (day <= last_day) & (hour <= 23) & (minute <= 59) & (second <= 60)
             & F.coalesce((offset_h <= 23) & (offset_m <= 59), F.lit(True)))
    # days from the civil date (proleptic Gregorian), integer arithmetic only
    y = year - F.when(month <= 2, 1).otherwise(0)
    era = F.floor(y / 400)
    yoe = y - era * 400
    doy = F.floor((153 * (month + F.when(month > 2, -3).otherwise(9)) + 2) / 5) + day - 1
    doe = yoe * 365 + F.floor(yoe / 4) - F.floor(yoe / 100) + doy
    days = era * 146097 + doe - 719468
    fraction = F.rpad(F.substring(group(7), 1, 3), 3, "0").cast("long")
    sign = F.when(group(9) == "-", -1).otherwise(1)
    offset = F.when(group(9) != "", sign * (offset_h * 60 + offset_m) * 60_000).otherwise(0)
    ms = (days * 86_400_000 + hour * 3_600_000 + minute * 60_000 + second * 1000 + fraction
          - offset)
    return F.when(valid, ms), valid


def header_envelope(rows: DataFrame) -> tuple[DataFrame, list[Rule]]:
    """Step 2: ``rows`` with ``_env`` (an envelope struct: times as epoch-ms longs, ``payload``
    the value, ``headers`` the application's) and ``_content_type``, and the rules of Step 2."""
    for name in REQUIRED:  # each header's values once, in columns the rules read
        rows = rows.withColumn(f"_hv_{name}", _values(name))
    rows = fence(rows)
    counts = {name: F.coalesce(F.size(f"_hv_{name}"), F.lit(0)) for name in REQUIRED}
    firsts = {name: F.try_element_at(F.col(f"_hv_{name}"), F.lit(1)) for name in REQUIRED}
    texts = {name: F.col(f"_ht_{name}") for name in REQUIRED}
    for name in REQUIRED:
        rows = rows.withColumn(f"_ht_{name}", firsts[name].cast("string"))
    for name in (TIME, EXPIRY_TIME):  # parsed once, read by the rules and the envelope
        ms, valid = _epoch_ms(texts[name])
        rows = rows.withColumn(f"_ms_{name}", ms).withColumn(f"_ok_{name}", valid)
    rows = fence(rows)
    rules: list[Rule] = []
    for name in REQUIRED:
        one = counts[name] == 1
        rules += [
            (counts[name] > 1, _malformed(f"header {name} appears more than once")),
            (one & firsts[name].isNull(), _malformed(f"header {name} has no value")),
            (one & ~F.coalesce(F.is_valid_utf8(firsts[name]), F.lit(True)),
             _malformed(f"header {name} is not UTF-8 text")),
        ]
    missing = F.array_compact(F.array(*[F.when(counts[n] == 0, F.lit(n)) for n in REQUIRED]))
    rules.append((F.size(missing) > 0, _malformed(F.concat(
        F.lit("missing header"), F.when(F.size(missing) > 1, "s").otherwise(""), F.lit(" "),
        F.concat_ws(", ", missing)))))
    spec, attempt = texts[SPEC_VERSION], texts[ATTEMPT]
    rules.append((spec != "1.0", _malformed(F.concat(
        F.lit(f"{SPEC_VERSION} is '"), F.substring(spec, 1, 40), F.lit("', not '1.0'")))))
    whole = attempt.rlike(r"^[1-9][0-9]{0,9}\z")
    attempt_n = F.when(whole, attempt.cast("long"))
    rules.append((~whole | (attempt_n > 2**31 - 1), _malformed(F.concat(
        F.lit(f"{ATTEMPT} '"), F.substring(attempt, 1, 40),
        F.lit("' is not a whole number from 1 to 2^31-1")))))
    times = {}
    for name in (TIME, EXPIRY_TIME):
        times[name] = F.col(f"_ms_{name}")
        rules.append((~F.col(f"_ok_{name}"), _malformed(F.concat(F.lit(f"{name} '"),
                                                  F.substring(texts[name], 1, 60),
                                                  F.lit("' is not an RFC 3339 time")))))
    app = F.filter(F.col("headers"), lambda h: ~F.lower(h.getField("key")).isin(*RESERVED)
                   & h.getField("value").isNotNull())
    # the last value of a name, as the consumer's dict keeps it (a map refuses repeated keys)
    last = F.filter(app, lambda h, i: ~F.exists(
        F.slice(app, i + 2, F.greatest(F.size(app) - i - 1, F.lit(1))),
        lambda g: g.getField("key") == h.getField("key")) | (i + 1 == F.size(app)))
    app_map = F.map_from_arrays(
        F.transform(last, lambda h: h.getField("key")),
        F.transform(last, lambda h: F.make_valid_utf8(h.getField("value").cast("string"))))
    env = F.struct(
        texts[ID].alias("id"),
        times[EXPIRY_TIME].alias("expires_at"),
        times[TIME].alias("created_at"),
        texts[PRODUCER].alias("producer"),
        F.when(attempt_n <= 2**31 - 1, attempt_n).cast("int").alias("attempt"),
        F.lit(None).cast("string").alias("payload_schema"),
        F.col("value").alias("payload"),
        F.coalesce(app_map, F.create_map().cast("map<string,string>")).alias("headers"),
        F.lit(None).cast("binary").alias("payload_fingerprint"),
    )
    rows = rows.withColumn("_env", env).withColumn(
        "_avro", F.coalesce(F.lower(texts[CONTENT_TYPE]) == F.lit(AVRO_CONTENT_TYPE),
                            F.lit(False)))
    return rows, rules


def _required(schema: dict[str, Any]) -> list[str]:
    """Top-level fields Avro cannot null: a PERMISSIVE ``from_avro`` that failed nulls them."""
    return [f["name"] for f in schema.get("fields", [])
            if not (isinstance(f["type"], list) and "null" in f["type"]) and f["type"] != "null"]


def header_payload(rows: DataFrame, plan: HeaderPlan, registry: SchemaRegistry,
                   payload_schema: str | None) -> tuple[DataFrame, Column, list[Rule]]:
    """Step 4: ``rows`` with one decoded column per writer schema of ``plan`` (each run only on
    its own rows), the payload column (the reader's struct with ``payload_schema``, else the
    raw value) and the rules. With ``payload_schema`` a raw payload is malformed, as a raw
    envelope payload is (the output's payload is the reader's struct)."""
    value, avro = F.col("value"), F.col("_avro")
    size = F.coalesce(F.octet_length(value), F.lit(0))
    magic = F.substring(value, 1, 1)
    body = value.substr(F.lit(FRAME_SIZE + 1), size - FRAME_SIZE)
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    framed = avro & (size > FRAME_SIZE) & (magic == F.lit(bytearray(b"\x00")))
    rules: list[Rule] = [
        (avro & value.isNull(), F.lit(f"not a Schema Registry framed value: no value, need "
                                      f"more than {FRAME_SIZE}")),
        (avro & (size <= FRAME_SIZE),
         F.format_string(f"not a Schema Registry framed value: %d bytes, need more than "
                         f"{FRAME_SIZE}", size)),
        (avro & (magic != F.lit(bytearray(b"\x00"))),
         F.concat(F.lit("not a Schema Registry framed value: starts with "),
                  F.lower(F.hex(magic)), F.lit(", expected 00"))),
    ]
    for refused, reason in sorted(plan.refused.items()):
        rules.append((framed & (schema_id == refused), F.lit(reason)))
    planned = sorted({*plan.writers, *plan.refused})
    new = framed & (~schema_id.isin(*planned) if planned else F.lit(True))
    # a framed payload the plan cannot read stops the micro-batch before it commits
    stop = (F.concat(F.lit(f"{NEW_SCHEMA_ID} "), schema_id.cast("string")) if plan.registry
            else F.concat(F.lit(f"{NEEDS_REGISTRY} (schema id "), schema_id.cast("string"),
                          F.lit(")")))
    rules.append((new, F.raise_error(stop).cast("string")))
    if plan.writers:
        check_limits(rows.sparkSession)  # a few bytes declaring 2 GiB would exit the JVM
    reader = registry.get(payload_schema) if payload_schema is not None else None
    if reader is not None:
        rules.append((~avro, F.lit(f"payload schema null (raw bytes) is not {reader.name}")))
    decoded: Any = F
    for n in sorted(plan.writers):
        writer = RegisteredSchema.from_json(json.loads(plan.writers[n]))
        mine = framed & (schema_id == n)
        if reader is not None and writer.name != reader.name:
            rules.append((mine, F.lit(f"payload schema {writer.name} is not {reader.name}")))
            continue
        target = reader if reader is not None else (
            registry.get(writer.name) if writer.name in registry else writer)
        options = {"mode": "PERMISSIVE"}
        if target.fingerprint != writer.fingerprint:
            options["avroSchema"] = json.dumps(target.schema)
        column = f"_payload_{n}"
        try:
            rows = rows.withColumn(column, F.when(mine, from_avro(
                body, json.dumps(writer.schema), options)))
        except (AnalysisException, IllegalArgumentException, Py4JJavaError) as exc:
            # a schema Spark cannot convert (or resolve): its records are dead letters, the
            # query runs on (a consumer may read them: docs/design.md §7)
            java = getattr(exc, "java_exception", None)
            words = " ".join(str(exc if java is None else java.toString()).split())[:200]
            log.warning("schema id %d (%s) cannot be read by from_avro: %s", n, writer.name,
                        words)
            rules.append((mine, F.lit(f"schema id {n} ({writer.name}) cannot be read by "
                                      f"Spark's from_avro")))
            continue
        failed: Any = F.lit(False)
        for name in _required(target.schema):
            failed = failed | F.col(column).getField(name).isNull()
        rules.append((mine & failed, F.lit(f"payload is not a valid {writer.name} record")))
        decoded = decoded.when(mine, F.col(column))
    payload: Column = value if reader is None else (
        F.lit(None) if decoded is F else decoded)
    return fence(rows), payload, rules


def decode_headers(raw: DataFrame, plan: HeaderPlan, registry: SchemaRegistry, *,
                   payload_schema: str | None, max_ttl_ms: int, limits: InputLimits
                   ) -> DataFrame:
    """Kafka source rows in the header format (with ``headers``) -> the decode's output rows
    (:func:`eoguard_spark.decode.decode`'s columns; module docstring for the steps)."""
    rows = raw.select("topic", "partition", "offset", "key", "value", "headers",
                      F.col("timestamp").alias("kafka_timestamp"))
    rows, head = header_envelope(rows)  # Step 2.
    env = F.col("_env")
    before, after = envelope_rules(env, F.col("_id"), limits=limits)  # Step 3.
    rows = rows.withColumn("_id", canonical_id(env.getField("id"))).withColumn(
        "_head", first_broken(head + before))
    rows, payload, rules = header_payload(fence(rows), plan, registry, payload_schema)  # 4.
    # the payload's rules only for a record not expired: a consumer drops that one unread
    return classify(rows, payload, after, max_ttl_ms=max_ttl_ms, limits=limits,
                    boundary="_headers", unexpired=rules)
