"""Envelope decoding as Spark Column expressions: no Python on the decode path.

A Kafka record value is ``C3 01``, the 8-byte fingerprint of the envelope schema that wrote
it, then the Avro body (docs/design.md §3). Per row:

  Step 1. Check the 2-byte marker and that the fingerprint names a known envelope version.
  Step 2. Drop the 10-byte header and ``from_avro`` the body in PERMISSIVE mode with the
          writer's version (an older version is resolved to the current one through the
          ``avroSchema`` option), so a corrupt body becomes a dead letter, not a failed batch.
          Times are read as epoch-ms longs (logical types dropped): an absurd expiry is a
          number the input rules refuse, not a timestamp that overflows.
  Step 3. The input rules (:mod:`eoguard_spark.rules`, as a GuardedConsumer applies them):
          strings valid UTF-8, the id normalised to canonical UUID text, expiry and size bounds.
  Step 4. Optionally decode the payload into the application's current schema: one
          ``from_avro`` per writer version (named by the envelope's ``payload_fingerprint``),
          each resolved to the current version, so the output schema stays the reader's.
  Step 5. Classify: ``malformed`` (the first rule broken, with its reason), ``expired``
          (``expires_at`` has passed at the micro-batch's timestamp, the same on a replay),
          else ``ok``.
"""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.avro.functions import from_avro

from eoguard.codec import ENVELOPE_SCHEMA, HEADER_SIZE, MAGIC, InputLimits, SchemaRegistry
from eoguard.store.keys import DEFAULT_MAX_TTL_MS
from eoguard_spark.rules import (
    Rule,
    beyond_max_ttl,
    canonical_id,
    envelope_rules,
    first_broken,
)

__all__ = ["DEAD_LETTER_COLUMNS", "OUTPUT_COLUMNS", "RowStatus", "classify", "decode", "fence"]


log = logging.getLogger(__name__)


class RowStatus(str, enum.Enum):
    """What happened to a row; ``OK`` rows go on to dedup, which refines them."""

    OK = "ok"
    MALFORMED = "malformed"
    EXPIRED = "expired"
    NEW = "new"  # claimed by this micro-batch: absent before, or taken over (lapsed lease)
    MINE = "mine"  # claimed at this position before (a retried task, a replay): re-owned
    DONE_HERE = "done_here"  # a replay of a batch whose done mark landed: written again
    DUPLICATE = "duplicate"
    BUSY = "busy"  # held by another reader of the scope under a live lease: skipped
    STALE = "stale"  # a replay of a done batch meeting a row it did not take: left out

    @classmethod
    def to_output(cls) -> tuple[str, ...]:
        """Statuses whose rows reach the sinks (``ok``: the modes without Redis claims)."""
        return (cls.OK.value, cls.NEW.value, cls.MINE.value, cls.DONE_HERE.value)

    @classmethod
    def to_dead_letter(cls, *, expired: bool) -> tuple[str, ...]:
        return (cls.MALFORMED.value, cls.EXPIRED.value) if expired else (cls.MALFORMED.value,)


OUTPUT_COLUMNS = (
    "id", "expires_at", "created_at", "producer", "attempt", "payload_schema", "payload",
    "headers", "key", "topic", "partition", "offset", "kafka_timestamp",
)
"""Columns of the output rows (the Redis mode adds ``position``: the claim's position,
:func:`eoguard.store.dedup.position` of this query's reader and the record)."""

DEAD_LETTER_COLUMNS = (
    "topic", "partition", "offset", "kafka_timestamp", "key", "value", "id", "expires_at",
    "status", "reason",
)


def _required_fields(schema: dict[str, Any]) -> list[str]:
    """Top-level fields that cannot be null in Avro: a PERMISSIVE decode failure nulls them."""
    out = []
    for fld in schema.get("fields", []):
        kind = fld["type"]
        if not (isinstance(kind, list) and "null" in kind) and kind != "null":
            out.append(fld["name"])
    return out


def _decode_failed(struct: Column, schema: dict[str, Any]) -> Column | None:
    """True where a PERMISSIVE ``from_avro`` into ``schema`` failed (a field Avro cannot null
    is null); None when every top-level field is nullable: a failure cannot be told then."""
    required = _required_fields(schema)
    if not required:
        return None
    broken = F.lit(False)
    for name in required:
        broken = broken | struct.getField(name).isNull()
    out: Column = broken
    return out


def _writer_not_loaded(writer: Column, schema: str) -> Column:
    """The reason of a payload whose writer version of ``schema`` is not loaded (the
    consumer's words)."""
    return F.concat(F.lit("payload writer schema "), F.lower(F.hex(writer)),
                    F.lit(f" ({schema}) is not loaded: add that version to the schemas' "
                          "history/"))


def _envelope(body: Column, fingerprint: Column, registry: SchemaRegistry) -> Column:
    """The envelope struct (current schema, times as epoch-ms longs) of whichever known
    version wrote the body.

    A ``CASE`` over the fingerprint: each row runs only its own version's ``from_avro``.
    """
    current = registry.get(ENVELOPE_SCHEMA)
    current_json = json.dumps(current.without_logical_types())
    result: Any = F
    for version in registry.versions(ENVELOPE_SCHEMA):
        opts = {"mode": "PERMISSIVE"}
        if version.fingerprint != current.fingerprint:
            opts["avroSchema"] = current_json
        parsed = from_avro(body, json.dumps(version.without_logical_types()), opts)
        result = result.when(fingerprint == F.lit(bytearray(version.fingerprint)), parsed)
    envelope: Column = result
    return envelope


def _header_rules(value: Column, magic: Column, fingerprint: Column, env: Column,
                  registry: SchemaRegistry) -> list[Rule]:
    """Steps 1 and 2: the marker, the fingerprint, a body ``from_avro`` could read."""
    known = [F.lit(bytearray(v.fingerprint)) for v in registry.versions(ENVELOPE_SCHEMA)]
    return [
        (value.isNull(), F.lit("bad magic: the record has no value")),
        (F.length(value) < HEADER_SIZE,
         F.format_string("bad magic: %d bytes, shorter than the %d-byte header",
                         F.length(value), F.lit(HEADER_SIZE))),
        (magic != F.lit(bytearray(MAGIC)),
         F.concat(F.lit("bad magic: starts with "), F.lower(F.hex(magic)),
                  F.lit(", expected c301"))),
        (~fingerprint.isin(*known),
         F.concat(F.lit("unknown fingerprint "), F.lower(F.hex(fingerprint)))),
        (env.getField("id").isNull(),
         F.lit(f"corrupt envelope: the body is not a valid {ENVELOPE_SCHEMA}")),
        (~_all_utf8(env),
         F.lit(f"corrupt envelope: a string of the {ENVELOPE_SCHEMA} is not valid UTF-8")),
    ]


def _all_utf8(env: Column) -> Column:
    """Every string of the envelope is valid UTF-8 (``from_avro`` does not check; fastavro
    does, so a GuardedConsumer finds such a record corrupt too).

    The header keys (and values) are checked as one string joined by an ASCII byte: an ASCII
    byte is a character of its own in UTF-8, so the join is valid iff every part is. A lambda
    (``forall``) would say the same but has no generated code, and would turn whole-stage
    codegen off for the whole projection.
    """
    headers = env.getField("headers")
    return (F.is_valid_utf8(env.getField("id")) & F.is_valid_utf8(env.getField("producer"))
            & F.coalesce(F.is_valid_utf8(env.getField("payload_schema")), F.lit(True))
            & F.is_valid_utf8(F.concat_ws(",", F.map_keys(headers)))
            & F.is_valid_utf8(F.concat_ws(",", F.map_values(headers))))


def _payload(env: Column, registry: SchemaRegistry, payload_schema: str
             ) -> tuple[Column, list[Rule]]:
    """Step 4: the payload decoded into the current version of ``payload_schema``, and the
    rules it must pass.

    A ``CASE`` over the writer fingerprint, as for the envelope: a payload of the current
    version (or with no fingerprint: envelopes before version 3) is read as it is; one of an
    older or newer version is read with that version and resolved into the current one.
    """
    app = registry.get(payload_schema)
    app_json = json.dumps(app.schema)
    body, writer = env.getField("payload"), env.getField("payload_fingerprint")
    current = writer.isNull() | (writer == F.lit(bytearray(app.fingerprint)))
    decoded: Any = F.when(current, from_avro(body, app_json, {"mode": "PERMISSIVE"}))
    known = current
    for version in registry.versions(payload_schema):
        if version.fingerprint != app.fingerprint:
            this = writer == F.lit(bytearray(version.fingerprint))
            decoded = decoded.when(this, from_avro(body, json.dumps(version.schema),
                                                   {"mode": "PERMISSIVE", "avroSchema": app_json}))
            known = known | this
    payload: Column = decoded
    declared = env.getField("payload_schema")
    rules: list[Rule] = [
        (declared.isNull() | (declared != F.lit(payload_schema)),
         F.concat(F.lit("payload schema "), F.coalesce(declared, F.lit("null (raw bytes)")),
                  F.lit(f" is not {payload_schema}"))),
        (~known, _writer_not_loaded(writer, payload_schema)),
    ]
    broken = _decode_failed(F.col("_payload"), app.schema)
    if broken is not None:
        rules.append((broken, F.lit(f"corrupt payload: not a valid {payload_schema}")))
    return payload, rules


CHECKS_PER_METHOD = 4
"""Payload versions checked per generated method (see :func:`fence`) without ``payload_schema``."""


def _payload_checks(rows: DataFrame, env: Column, registry: SchemaRegistry
                    ) -> tuple[DataFrame, list[Rule]]:
    """Step 4 without ``payload_schema``: the payload stays raw bytes, but a record that names
    a payload schema is checked as a GuardedConsumer checks it: the schema loaded, its writer
    version one of that schema's, the body a record of that version (a writer version of
    another schema is reported as not loaded, where the consumer names the other schema).

    One ``from_avro`` per loaded version, each in a ``CASE`` that runs it only on the rows of
    its own (schema, writer): rows with raw payloads decode nothing. A row breaks at most one
    schema's rules, so the checks run in groups of :data:`CHECKS_PER_METHOD` versions, each
    group folded into one reason column behind a :func:`fence`: the generated code stays in
    methods the JVM compiles, however many schemas are loaded. Unlike fastavro, ``from_avro``
    ignores bytes left after a complete record, so trailing bytes pass here; and a schema
    whose top-level fields are all nullable cannot tell a corrupt body (PERMISSIVE mode nulls
    the fields) from a record of nulls; a schema Spark cannot convert is skipped with a
    warning.
    """
    declared, writer = env.getField("payload_schema"), env.getField("payload_fingerprint")
    body = env.getField("payload")
    names = registry.names()  # the envelope's own too: the consumer's registry has it
    unknown = declared.isNotNull() & (~declared.isin(*names) if names else F.lit(True))
    rules: list[Rule] = [(unknown, F.concat(F.lit("no Avro schema named '"), declared,
                                            F.lit("' is loaded")))]
    group: list[Rule] = []  # the rules of the checks in ``rows`` not yet reduced to a reason
    checks: list[str] = []
    reason = "_payload_reason"
    rows = rows.withColumn(reason, F.lit(None).cast("string"))

    def reduce_group(rows: DataFrame) -> DataFrame:
        rows = fence(rows).withColumn(reason, F.coalesce(F.col(reason), first_broken(group)))
        group.clear()
        rows = rows.drop(*checks)
        checks.clear()
        return fence(rows)

    for n, name in enumerate(names):
        app = registry.get(name)
        app_json = json.dumps(app.schema)
        known = writer.isNull()
        for i, version in enumerate(registry.versions(name)):
            mine = (declared == F.lit(name)) & (writer == F.lit(bytearray(version.fingerprint)))
            if version.fingerprint == app.fingerprint:
                mine = (declared == F.lit(name)) & (writer.isNull() | mine)
            known = known | (writer == F.lit(bytearray(version.fingerprint)))
            options = {"mode": "PERMISSIVE"}
            if version.fingerprint != app.fingerprint:
                options["avroSchema"] = app_json  # resolved into the current version
            column = f"_check_{n}_{i}"
            try:
                rows = rows.withColumn(column, F.when(
                    mine, from_avro(body, json.dumps(version.schema), options)))
            except AnalysisException as exc:  # e.g. a recursive record Spark cannot convert
                log.warning("payload schema %s (%s) cannot be read by from_avro, so its "
                            "payloads pass unchecked: %s", name, version.fingerprint.hex(),
                            str(exc).splitlines()[0])
                continue
            checks.append(column)
            broken = _decode_failed(F.col(column), app.schema)
            if broken is not None:
                group.append((mine & broken, F.lit(f"payload is not a valid {name} record")))
        group.insert(0, ((declared == F.lit(name)) & ~known, _writer_not_loaded(writer, name)))
        if len(checks) >= CHECKS_PER_METHOD:
            rows = reduce_group(rows)
    if group or checks:
        rows = reduce_group(rows)
    rules.append((F.col(reason).isNotNull(), F.col(reason)))
    return rows, rules


def fence(df: DataFrame) -> DataFrame:
    """``df`` behind an optimizer and codegen fence: the same rows and columns, but

    - a filter on them (the sinks' ``status``) is not pushed below, where Spark would inline
      the decoding expressions into the filter and run ``from_avro`` twice per row (once to
      filter, once to project): Spark pushes filters through projections of deterministic
      expressions, whatever they cost, but not below a generator's output;
    - the code Spark generates after it goes into a Java method of its own. Whole-stage codegen
      puts a chain of projections in one method, and HotSpot does not compile a method over
      8,000 bytes of bytecode (``-XX:+DontCompileHugeMethods``): the whole decode in one method
      (about 22 KB) ran interpreted, at half the speed. An operator that consumes every column
      of its input, as this generator does, starts a new method.

    The rows go through ``inline(array(struct))``.
    """
    return df.select(F.inline(F.array(F.struct(*df.columns))))


CLOCK_BOUNDARY = "eoguard_decoded"
"""The name of the observation that ends the decode's clock-free stage (see clock_boundary)."""
CLOCKED_BOUNDARY = "eoguard_clocked"
"""The name of the observation that ends the stage that reads the clock."""


def clock_boundary(df: DataFrame, name: str = CLOCK_BOUNDARY) -> DataFrame:
    """``df`` with a whole-stage codegen boundary on top: an observation (``CollectMetrics``,
    for which Spark generates no code) counting its rows.

    In a streaming query ``current_timestamp()`` becomes the micro-batch's timestamp as a
    literal after optimization, and a long literal is written into the generated Java code.
    A stage that reads the clock is thus new code every micro-batch: compiled again, and
    JIT-compiled again from the interpreter up (that took more CPU than the decode itself).
    So the decode puts one boundary below the expressions that read the clock and one
    (``name``) above them: the stages below (the ``from_avro`` calls) and above (the output
    projection, the job's filters and the sink's writer; unless something above reads the
    clock too, as the watermark mode does) are the same code every batch,
    compiled once per query; only the small stage between them changes. (Its literal cannot
    be kept out of the code: Spark turns the batch's clock into one after optimizing.)
    """
    return df.observe(name, F.count(F.lit(1)).alias("rows"))


def decode(raw: DataFrame, registry: SchemaRegistry, *, payload_schema: str | None = None,
           max_ttl_ms: int = DEFAULT_MAX_TTL_MS, limits: InputLimits | None = None
           ) -> DataFrame:
    """Kafka source rows -> one row per record with the envelope's fields, ``status``, ``reason``.

    ``payload`` is the application's record as a struct when ``payload_schema`` names one
    (a record written with another schema is malformed here), else the raw payload bytes.
    ``value`` (the raw record) is kept only on rows that are not ``ok``, for dead letters.
    ``max_ttl_ms`` (the key prefix's) and ``limits`` bound what a record may claim (Step 3).
    Each ``from_avro`` runs once per row, the generated code stays in methods the JVM
    compiles (see :func:`fence`), and only a small stage reads the micro-batch's clock (see
    :func:`clock_boundary`).
    """
    limits = InputLimits() if limits is None else limits
    value = F.col("value")
    body = value.substr(F.lit(HEADER_SIZE + 1), F.length(value) - HEADER_SIZE)
    # Steps 1 and 2. Later steps refer to the decoded struct by column, so from_avro runs once.
    rows = raw.select(
        "topic", "partition", "offset", "key", "value",
        F.col("timestamp").alias("kafka_timestamp"),
        F.substring(value, 1, 2).alias("_magic"), F.substring(value, 3, 8).alias("_fingerprint"),
        _envelope(body, F.substring(value, 3, 8), registry).alias("_env"),
    )
    env = F.col("_env")
    # Step 3. The rules before the expiry bound, then (a method of its own) those after it.
    before, after = envelope_rules(env, F.col("_id"), limits=limits)
    rows = rows.withColumn("_id", canonical_id(env.getField("id"))).withColumn(
        "_head", first_broken(_header_rules(value, F.col("_magic"), F.col("_fingerprint"), env,
                                            registry) + before))
    rows = fence(rows)  # the generated code in methods the JVM compiles (see fence)
    payload: Column = env.getField("payload")
    if payload_schema is not None:  # Step 4.
        decoded, payload_rules = _payload(env, registry, payload_schema)
        rows = rows.withColumn("_payload", decoded)
        payload = F.col("_payload")
    else:
        rows, payload_rules = _payload_checks(rows, env, registry)
    return classify(rows, payload, after + payload_rules, max_ttl_ms=max_ttl_ms, limits=limits)


def classify(rows: DataFrame, payload: Column, tail: list[Rule], *, max_ttl_ms: int,
             limits: InputLimits, boundary: str = "", unexpired: list[Rule] | None = None
             ) -> DataFrame:
    """Step 5 of every decode that builds an envelope struct (``_env``, times as epoch-ms
    longs) from a record: ``rows`` hold it, its canonical id (``_id``) and the reason of the
    first rule broken before the expiry bound (``_head``); ``tail`` are the rules after it,
    ``payload`` the output's payload. The output columns, as :func:`decode` says.
    ``boundary`` tells its observations (:func:`clock_boundary`) from another decode's in one
    query (their names must differ). ``unexpired`` are rules judged only on a row not expired
    (the header format's payload rules: a consumer drops an expired record unread)."""
    env, value = F.col("_env"), F.col("value")
    rows = rows.withColumn("_tail", first_broken(tail))
    if unexpired:
        rows = rows.withColumn("_unexpired", first_broken(unexpired))
    rows = clock_boundary(rows, CLOCK_BOUNDARY + boundary)
    # Step 5, behind the boundary: the only expressions that read the micro-batch's clock.
    now_ms = F.unix_millis(F.current_timestamp())  # the micro-batch's: the same on a replay
    expires_ms = env.getField("expires_at")
    rows = rows.withColumn("reason", F.coalesce(
        F.col("_head"),
        first_broken([beyond_max_ttl(env, now_ms=now_ms, max_ttl_ms=max_ttl_ms, limits=limits)]),
        F.col("_tail"),
        F.when(expires_ms > now_ms, F.col("_unexpired")) if unexpired else F.lit(None),
    )).withColumn(
        "status",
        F.when(F.col("reason").isNotNull(), F.lit(RowStatus.MALFORMED.value))
        .when(expires_ms <= now_ms, F.lit(RowStatus.EXPIRED.value))
        .otherwise(F.lit(RowStatus.OK.value)),
    )
    rows = clock_boundary(rows, CLOCKED_BOUNDARY + boundary)  # the clock's stage ends
    status = F.col("status")
    valid = status != RowStatus.MALFORMED.value  # times in range, the id a UUID
    expires_at = F.when(valid, F.timestamp_millis(expires_ms))
    expired_reason = F.concat(F.lit("expired at "),
                              F.date_format(expires_at, "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"))
    return fence(rows.select(
        F.when(valid, F.col("_id")).otherwise(env.getField("id")).alias("id"),
        expires_at.alias("expires_at"),
        F.when(valid, expires_ms).alias("expires_at_ms"),
        F.when(valid, F.timestamp_millis(env.getField("created_at"))).alias("created_at"),
        env.getField("producer").alias("producer"),
        env.getField("attempt").alias("attempt"),
        env.getField("payload_schema").alias("payload_schema"),
        F.when(status != RowStatus.MALFORMED.value, payload).alias("payload"),
        env.getField("headers").alias("headers"),
        "key", "topic", "partition", "offset", "kafka_timestamp",
        F.when(status != RowStatus.OK.value, value).alias("value"),
        "status",
        F.when(status == RowStatus.EXPIRED.value, expired_reason)
        .otherwise(F.col("reason")).alias("reason"),
    ))
