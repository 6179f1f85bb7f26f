"""The Structured Streaming job: Kafka -> decode -> expiry -> dedup -> idempotent sinks.

:func:`build_query` starts it on a session the caller owns; :func:`run` builds a local
session and blocks; ``python -m connectors.spark`` is the command. Every micro-batch goes
through :class:`BatchProcessor` (``foreachBatch``); its docstring lists the steps.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.streaming.query import StreamingQuery

from connectors.spark.decode import DEAD_LETTER_COLUMNS, OUTPUT_COLUMNS, RowStatus, decode
from connectors.spark.dedup import (
    DONE_COUNTS_SCHEMA,
    ClaimSettings,
    claim_status,
    mark_done_partitions,
    owner_column,
    resolve_busy,
)
from connectors.spark.options import DedupMode, JobOptions
from connectors.spark.sink import BatchLedger, ParquetBatchSink, query_id_of
from eoguard.codec import SchemaRegistry
from eoguard.errors import ConfigError
from eoguard.stack import spark_jars
from eoguard.store.layout import check_layout

__all__ = ["BatchProcessor", "BatchStats", "build_query", "local_session", "run"]

log = logging.getLogger(__name__)

ForeachBatch = Callable[[DataFrame, int], None]
Transform = Callable[[DataFrame], DataFrame]


@dataclass(slots=True)
class BatchStats:
    """What one micro-batch did. ``replayed``: its sinks had committed before a crash."""

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)  # RowStatus value -> count
    done: int = 0
    already_done: int = 0
    not_owned: int = 0
    replayed: bool = False
    duration_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)  # claim, sinks, hook, done

    @property
    def written(self) -> int:
        return sum(self.rows.get(s, 0) for s in RowStatus.to_output())

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases_s[name] = round(time.monotonic() - started, 3)


class BatchProcessor:
    """The ``foreachBatch`` function. Per micro-batch ``N``:

    Step 1. If the ledger says the sinks committed ``N`` (a crash hit after that), go to
            Step 5: nothing is claimed or written again.
    Step 2. Redis mode: claim the batch's ids on the executors (owner = source position);
            claims another owner holds (BUSY) are resolved after the pass: a duplicate of a
            row this batch claimed is dropped, others are waited on and claimed again. The
            classified rows are cached for Steps 3-4 and counted by status.
    Step 3. Dead letters (malformed, expired), then the accepted rows to the Parquet sink:
            written to a temporary directory and renamed to ``batch_id=N`` (replace, never
            append). If the Parquet sink committed ``N`` already, its rows are the batch's.
    Step 4. The user's ``foreach_batch(rows, N)``; then the ledger records ``N``.
    Step 5. Redis mode: mark the claims done on the executors, a second pass over the
            ``(id, owner)`` of what the sinks hold; only now can duplicates elsewhere in the
            scope be dropped for good, and the senders' outbox records be acknowledged.
    """

    def __init__(self, spark: SparkSession, options: JobOptions, *,
                 foreach_batch: ForeachBatch | None = None,
                 on_batch: Callable[[BatchStats], None] | None = None) -> None:
        self.spark = spark
        self.options = options
        self.foreach_batch = foreach_batch
        self.on_batch = on_batch
        self.settings = ClaimSettings.of(options)
        self.ledger = BatchLedger(spark, options.checkpoint)
        self._sinks: tuple[ParquetBatchSink | None, ParquetBatchSink | None] | None = None

    def sinks(self) -> tuple[ParquetBatchSink | None, ParquetBatchSink | None]:
        """(output, dead letters), bound to the query id once the checkpoint has it."""
        if self._sinks is None:
            query_id = query_id_of(self.spark, self.options.checkpoint)
            out, dead = self.options.output_path, self.options.dead_letter_path
            self._sinks = (
                ParquetBatchSink(self.spark, out, query_id=query_id) if out else None,
                ParquetBatchSink(self.spark, dead, query_id=query_id) if dead else None,
            )
        return self._sinks

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        stats = BatchStats(batch_id)
        redis_mode = self.options.dedup is DedupMode.REDIS
        output = self.sinks()[0]
        cached: list[DataFrame] = []
        try:
            if self.ledger.has(batch_id):  # Step 1.
                stats.replayed = True
                held = output.read(batch_id) if output else self._own_rows(df)
            else:
                held = self._write(df, batch_id, stats, cached)
                if self.foreach_batch is not None:  # Step 4.
                    with stats.phase("hook"):
                        self.foreach_batch(held, batch_id)
                self.ledger.put(batch_id)
            if redis_mode:  # Step 5.
                with stats.phase("done"):
                    self._mark_done(held, stats)
        finally:
            for frame in cached:
                frame.unpersist()
        stats.duration_s = time.monotonic() - started
        log.info("eoguard batch %d: %s", batch_id, stats)
        if self.on_batch is not None:
            self.on_batch(stats)

    def _write(self, df: DataFrame, batch_id: int, stats: BatchStats, cached: list[DataFrame]
               ) -> DataFrame:
        """Steps 2 and 3: returns the rows the sinks hold; adds cached frames to ``cached``."""
        output, dead = self.sinks()
        if output is not None and output.committed(batch_id):
            stats.replayed = True
            return output.read(batch_id)

        def keep(frame: DataFrame) -> DataFrame:
            frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(frame)
            stats.rows = {row["status"]: int(row["count"])
                          for row in frame.groupBy("status").count().collect()}
            return frame

        columns = list(OUTPUT_COLUMNS)
        with stats.phase("classify"):
            if self.options.dedup is DedupMode.REDIS:  # Step 2.
                first_pass = replace(self.settings, busy_wait_ms=0)
                owned = df.withColumn("owner", owner_column(self.options.scope))
                classified = keep(owned.withColumn("status", claim_status(first_pass)))
                if stats.rows.get(RowStatus.BUSY.value):
                    classified = keep(resolve_busy(classified, self.settings))
                columns.append("owner")
            else:
                classified = keep(df)
        with stats.phase("sinks"):
            to_dead = RowStatus.to_dead_letter(expired=self.options.dead_letter_expired)
            if dead is not None and not dead.committed(batch_id):  # Step 3.
                dead.write(classified.filter(F.col("status").isin(*to_dead))
                           .select(*DEAD_LETTER_COLUMNS), batch_id)
            accepted = classified.filter(F.col("status").isin(*RowStatus.to_output()))
            accepted = accepted.select(*columns)
            if output is not None:
                output.write(accepted, batch_id)
        return accepted

    def _own_rows(self, df: DataFrame) -> DataFrame:
        """The rows this batch may have claimed, when no Parquet sink keeps what it wrote.

        Marking done a claim that is not ours is refused by the done script (NOT_OWNED), so
        the done pass over every ``ok`` row only completes this batch's own claims.
        """
        return (df.filter(F.col("status") == RowStatus.OK.value)
                .withColumn("owner", owner_column(self.options.scope)))

    def _mark_done(self, held: DataFrame, stats: BatchStats) -> None:
        rows = held.select("id", "owner", F.unix_millis("expires_at").alias("expires_at_ms"))
        # One row of counts per partition comes back (never the rows themselves).
        for part in rows.mapInArrow(mark_done_partitions(self.settings),
                                    DONE_COUNTS_SCHEMA).collect():
            stats.done += int(part["done"])
            stats.already_done += int(part["already_done"])
            stats.not_owned += int(part["not_owned"])
        if stats.not_owned:
            log.warning("batch %d: %d claims were no longer ours at done time (lease_s=%s too "
                        "short for the batch?)", stats.batch_id, stats.not_owned,
                        self.options.lease_s)


def _check_speculation(spark: SparkSession, options: JobOptions) -> None:
    conf = spark.sparkContext.getConf()
    speculation = str(conf.get("spark.speculation", "false")).strip().lower() == "true"
    if speculation and not options.idempotent_sink:
        raise ConfigError(
            "spark.speculation=true runs two live attempts of a task under one claim owner "
            "(the record's source position), so both pass the Redis claim and a sink with "
            "external effects would see the rows twice. Turn speculation off, or confirm the "
            "sink is idempotent per (batch_id, id) with idempotent_sink=True "
            "(--idempotent-sink); the Parquet sink is.")


def _check_layout(options: JobOptions) -> None:
    """The scope's key layout must match the consumers' (see eoguard.store.layout)."""
    client = redis.Redis.from_url(options.redis_url)
    try:
        check_layout(client, options.keyspace())
    finally:
        client.close()


def build_query(spark: SparkSession, options: JobOptions, *,
                foreach_batch: ForeachBatch | None = None, transform: Transform | None = None,
                on_batch: Callable[[BatchStats], None] | None = None) -> StreamingQuery:
    """Start the job on ``spark`` and return the running query.

    ``transform`` maps the decoded stream before dedup (filter or enrich rows; a row it
    drops is not claimed). ``foreach_batch(rows, batch_id)`` is a user sink called once per
    batch after the Parquet sink; it must replace per ``batch_id`` (a replayed batch calls it
    again with the same rows unless every sink had committed). ``on_batch`` gets each
    batch's :class:`BatchStats`.
    """
    if options.output_path is None and foreach_batch is None:
        raise ConfigError("the job needs a sink: output_path and/or a foreach_batch hook")
    _check_speculation(spark, options)
    if options.dedup is DedupMode.REDIS:
        _check_layout(options)
    if options.dead_letter_path is None:
        log.warning("no dead_letter_path: malformed%s records are only counted",
                    " and expired" if options.dead_letter_expired else "")
    registry = (SchemaRegistry.from_dir(options.schema_dir) if options.schema_dir
                else SchemaRegistry.default())
    raw = spark.readStream.format("kafka").options(**options.source_options()).load()
    rows = decode(raw, registry, payload_schema=options.payload_schema)
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
    processor = BatchProcessor(spark, options, foreach_batch=foreach_batch, on_batch=on_batch)
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
    they import the same eoguard and pyarrow as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder: Any = (SparkSession.builder.master(master).appName(app_name)
                    .config("spark.jars", spark_jars())
                    .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
                    .config("spark.ui.enabled", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    return session


def run(options: JobOptions, *, spark: SparkSession | None = None,
        foreach_batch: ForeachBatch | None = None,
        on_batch: Callable[[BatchStats], None] | None = None) -> None:
    """Run the job until it stops (``available_now``: once everything available is done)."""
    session = spark or local_session()
    query = build_query(session, options, foreach_batch=foreach_batch, on_batch=on_batch)
    query.awaitTermination()
