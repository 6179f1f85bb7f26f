"""The Structured Streaming job: Kafka -> decode -> expiry -> dedup -> idempotent sinks.

:func:`build_query` starts it on a session the caller owns; :func:`run` builds a local
session and blocks; ``python -m eoguard_spark`` is the command. Every micro-batch goes
through :class:`MicroBatchRunner` (``foreachBatch``); its docstring lists the steps.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.streaming.query import StreamingQuery

from eoguard.callbacks import require_sync
from eoguard.codec import SchemaRegistry
from eoguard.config import SchemaRegistryConfig
from eoguard.errors import ConfigError
from eoguard.stack import spark_jars
from eoguard.store.client import connect
from eoguard.store.layout import check_layout
from eoguard_spark.acks import wait_for_acks
from eoguard_spark.avro_schema import avro_session_conf
from eoguard_spark.batch import BatchProcessor, BatchStats, ForeachBatch, MicroBatchRunner
from eoguard_spark.decode import RowStatus
from eoguard_spark.header_format import (
    HeaderPlan,
    needs_registry,
    new_schema_ids,
    plan_from_registry,
)
from eoguard_spark.options import DedupMode, JobOptions
from eoguard_spark.plain import decode_topic
from eoguard_spark.redaction import redaction_conf
from eoguard_spark.sink import reader_mismatch, recorded_reader

__all__ = ["BatchProcessor", "BatchStats", "MicroBatchRunner", "build_query", "local_session",
           "run"]  # re-exported

log = logging.getLogger(__name__)

Transform = Callable[[DataFrame], DataFrame]


def _check_speculation(spark: SparkSession, options: JobOptions,
                       foreach_batch: ForeachBatch | None) -> None:
    """Speculation is safe for the claims and the Parquet sink, not for a hook's effects.

    Two live attempts of a task claim under the batch's token at the same positions and reach
    the same outcome per row (a row one gives up as BUSY the other leaves out too:
    :mod:`eoguard_spark.claims`); Spark commits one attempt's Parquet files. A
    ``foreach_batch`` hook may run per-attempt effects twice: refused unless the user says it
    is idempotent.
    """
    conf = spark.sparkContext.getConf()
    speculation = str(conf.get("spark.speculation", "false")).strip().lower() == "true"
    if speculation and foreach_batch is not None and not options.idempotent_sink:
        raise ConfigError(
            "spark.speculation=true runs two live attempts of a task: both claim under the "
            "micro-batch's token at the same positions and keep the same rows, and the "
            "Parquet sink commits one attempt's files, but a foreach_batch hook may see the "
            "effects of both attempts. Turn speculation off, or confirm the hook is "
            "idempotent per (batch_id, id) with idempotent_sink=True (--idempotent-sink).")


def _check_reader(spark: SparkSession, options: JobOptions) -> None:
    """A configured reader must match the one the checkpoint recorded (see resolve_reader)."""
    recorded = recorded_reader(spark, options.checkpoint)
    if options.reader is not None and recorded is not None and options.reader != recorded:
        raise ConfigError(reader_mismatch(options.checkpoint, recorded, options.reader))


def _check_layout(options: JobOptions) -> None:
    """The scope's key layout must match the consumers' (see eoguard.store.layout)."""
    client = connect(options.redis_url)
    try:
        check_layout(client, options.keyspace())
    finally:
        client.close()


def _header_plan(options: JobOptions, schema_ids: tuple[int, ...]) -> HeaderPlan | None:
    """The writer schemas the query decodes header-format records with, fetched now; None
    without ``header_format`` (such records are then not envelopes: dead letters); a plan
    without a registry for ``header_format`` alone (raw payloads)."""
    if not options.header_format:
        return None
    if options.schema_registry_url is None:
        return HeaderPlan(registry=False)
    client = SchemaRegistryConfig(url=options.schema_registry_url,
                                  options=dict(options.schema_registry_options)).connect()
    try:
        plan = plan_from_registry(client, options.topics, schema_ids)
    finally:
        client.close()
    log.info("header format: writer schema ids %s (refused: %s)", sorted(plan.writers),
             sorted(plan.refused))
    return plan


def build_query(spark: SparkSession, options: JobOptions, *,
                foreach_batch: ForeachBatch | None = None, transform: Transform | None = None,
                on_batch: Callable[[BatchStats], None] | None = None,
                schema_ids: tuple[int, ...] = ()) -> StreamingQuery:
    """Start the job on ``spark`` and return the running query.

    ``transform`` maps the decoded stream before dedup (filter or enrich rows; a row it
    drops is not claimed). ``foreach_batch(rows, batch_id)`` is a user sink called once per
    batch after the Parquet sink; it must replace per ``batch_id`` (a replayed batch calls it
    again with the same rows unless every sink had committed). ``on_batch`` gets each
    batch's :class:`BatchStats`. An ``async def`` hook is refused (:class:`ConfigError`): the
    job never awaits one. With a Parquet sink the Redis mode acknowledges the senders'
    outbox records of a batch in the background: :func:`eoguard_spark.acks.wait_for_acks`
    waits for the last batch's. With ``schema_registry_url`` the writer schemas of the
    header format are fixed now (every version of each topic's subject, and ``schema_ids``);
    a micro-batch meeting another id fails before it commits anything, naming the id
    (:func:`eoguard_spark.header_format.new_schema_ids` reads it): build the query again
    with it, as :func:`run` does.
    """
    if options.output_path is None and foreach_batch is None:
        raise ConfigError("the job needs a sink: output_path and/or a foreach_batch hook")
    for hook, name in ((foreach_batch, "foreach_batch"), (transform, "transform"),
                       (on_batch, "on_batch")):
        require_sync(hook, name)  # before any connection (MicroBatchRunner checks its own too)
    _check_speculation(spark, options, foreach_batch)
    if options.dedup is DedupMode.REDIS:
        _check_layout(options)
        _check_reader(spark, options)
    if options.dead_letter_path is None:
        log.warning("no dead_letter_path: malformed%s records are only counted",
                    " and expired" if options.dead_letter_expired else "")
    registry = (SchemaRegistry.from_dir(options.schema_dir) if options.schema_dir
                else SchemaRegistry.default())
    raw = spark.readStream.format("kafka").options(**options.source_options()).load()
    rows = decode_topic(raw, registry, plain=options.plain,
                        payload_schema=options.payload_schema, max_ttl_ms=options.max_ttl_ms,
                        limits=options.input_limits.within_grace(int(options.grace_s * 1000)),
                        header_plan=_header_plan(options, schema_ids))
    if transform is not None:
        rows = transform(rows)
    if options.dedup is DedupMode.WATERMARK:
        # Malformed and expired rows are keyed by position and timed at the batch, so the
        # state operator neither merges them nor drops them as late: they reach dead letters.
        ok = F.col("status") == RowStatus.OK.value
        rows = (
            rows.withColumn("_dedup_key", F.when(ok, F.col("id")).otherwise(F.concat_ws(
                "|", F.lit("pos"), "topic", F.col("partition").cast("string"),
                F.col("offset").cast("string"))))
            .withColumn("_event_time", F.when(ok, F.col("created_at"))
                        .otherwise(F.current_timestamp()))
            .withWatermark("_event_time", options.watermark_delay)
            .dropDuplicatesWithinWatermark(["_dedup_key"])
        )
    processor = MicroBatchRunner(spark, options, foreach_batch=foreach_batch, on_batch=on_batch)
    writer = (rows.writeStream.foreachBatch(processor)
              .option("checkpointLocation", options.checkpoint))
    if options.query_name:
        writer = writer.queryName(options.query_name)
    if options.available_now:
        writer = writer.trigger(availableNow=True)
    elif options.trigger_interval:
        writer = writer.trigger(processingTime=options.trigger_interval)
    log.info("starting eoguard Spark job: %s", options.describe())
    return writer.start()


def local_session(*, master: str = "local[2]", app_name: str = "eoguard-spark",
                  shuffle_partitions: int = 4, conf: dict[str, str] | None = None
                  ) -> SparkSession:
    """A SparkSession with the Kafka and Avro connector jars in ``spark.jars`` (no download).

    Python workers run this interpreter (``PYSPARK_PYTHON``) unless it is set already, so
    they import the same eoguard and pyarrow as the driver. Spark's redaction covers the
    secrets the job may pass (:mod:`eoguard_spark.redaction`) unless ``conf`` says otherwise.
    Driver and executors cap what Avro's reader allocates (``avro_session_conf``): plain Avro
    values need it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder: Any = (SparkSession.builder.master(master).appName(app_name)
                    .config("spark.jars", spark_jars())
                    .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
                    .config("spark.ui.enabled", "false"))
    for key, value in {**redaction_conf(), **avro_session_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    return session


def run(options: JobOptions, *, spark: SparkSession | None = None,
        foreach_batch: ForeachBatch | None = None,
        on_batch: Callable[[BatchStats], None] | None = None) -> None:
    """Run the job until it stops (``available_now``: once everything available is done).

    A micro-batch that met a schema id new to the query (the header format) stops it; the
    query is built again with the id and goes on from its checkpoint: the batch is replayed
    and the record read (docs/design.md §7). One that met a registry-framed payload while
    the job has no ``schema_registry_url`` stops it with a :class:`ConfigError` naming it.
    """
    session = spark or local_session()
    seen: tuple[int, ...] = ()
    while True:
        query = build_query(session, options, foreach_batch=foreach_batch, on_batch=on_batch,
                            schema_ids=seen)
        try:
            query.awaitTermination()
            return
        except StreamingQueryException as exc:
            if needs_registry(exc):
                raise ConfigError(
                    "a record in the header wire format has an Avro payload (content-type "
                    "application/avro): reading it needs a Schema Registry, "
                    "schema_registry_url (--schema-registry-url); nothing of its "
                    "micro-batch was committed") from exc
            new = tuple(i for i in new_schema_ids(exc) if i not in seen)
            if not new:
                raise
            log.info("schema ids %s are new to the query: starting it again with them", new)
            seen = tuple(sorted({*seen, *new}))
        finally:
            wait_for_acks(query)  # the last batch's acknowledgement pass, in the background
