"""One micro-batch of the job (``foreachBatch``): claim, sinks, ledger, done marks.

:class:`BatchProcessor` is the function Spark calls per micro-batch; its docstring lists the
steps. :class:`BatchStats` is what each batch reports to ``on_batch``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from eoguard_spark.decode import DEAD_LETTER_COLUMNS, OUTPUT_COLUMNS, RowStatus
from eoguard_spark.dedup import (
    DONE_COUNTS_SCHEMA,
    ClaimSettings,
    claim_status,
    mark_done_partitions,
    owner_column,
    resolve_busy,
)
from eoguard_spark.options import DedupMode, JobOptions
from eoguard_spark.sink import BatchLedger, ParquetBatchSink, query_id_of, resolve_reader

__all__ = ["BatchProcessor", "BatchStats", "ForeachBatch"]

log = logging.getLogger(__name__)

ForeachBatch = Callable[[DataFrame, int], None]


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
    Step 2. Redis mode: claim the batch's ids on the executors (owner = this query's reader
            and the record's source position, the reader being kept in the checkpoint); a
            claim this query holds at another position is a duplicate at once. Claims another
            reader holds (BUSY) are resolved after the pass: a duplicate of a row this batch
            won is dropped, others are waited on and claimed again. The classified rows are
            cached for Steps 3-4 and counted by status.
    Step 3. Dead letters (malformed, expired), then the accepted rows to the Parquet sink:
            written to a temporary directory and renamed to ``batch_id=N`` (replace, never
            append). If the Parquet sink committed ``N`` already, its rows are the batch's.
    Step 4. The user's ``foreach_batch(rows, N)``; then the ledger records ``N``.
    Step 5. Redis mode: mark the claims done on the executors, a second pass (one task per
            core) over the ``(id, owner)`` of what the sinks hold; only now can duplicates
            elsewhere in the scope be dropped for good, and the senders' outbox records be
            acknowledged.
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
        self._reader: str | None = None

    def reader(self) -> str:
        """This query's reader in its claim owners (recorded in the checkpoint; stable)."""
        if self._reader is None:
            self._reader = resolve_reader(self.spark, self.options.checkpoint, self.options.reader)
        return self._reader

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
            """Cache ``frame`` (later steps read it twice or more) and count it by status."""
            frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(frame)
            for row in frame.groupBy("status").count().collect():
                stats.rows[row["status"]] = stats.rows.get(row["status"], 0) + int(row["count"])
            return frame

        columns = list(OUTPUT_COLUMNS)
        status = F.col("status")
        with stats.phase("classify"):
            if self.options.dedup is DedupMode.REDIS:  # Step 2.
                first_pass = replace(self.settings, busy_wait_ms=0)
                owned = df.withColumn("owner", owner_column(self.options.scope, self.reader()))
                classified = keep(owned.withColumn("status", claim_status(first_pass)))
                if stats.rows.pop(RowStatus.BUSY.value, 0):
                    # Only the few settled rows are cached again, not the whole batch.
                    settled = keep(resolve_busy(classified, self.settings))
                    classified = (classified.filter(status != RowStatus.BUSY.value)
                                  .unionByName(settled))
                columns.append("owner")
            else:
                classified = keep(df)
        with stats.phase("sinks"):
            to_dead = RowStatus.to_dead_letter(expired=self.options.dead_letter_expired)
            if dead is not None and not dead.committed(batch_id):  # Step 3.
                dead.write(classified.filter(status.isin(*to_dead))
                           .select(*DEAD_LETTER_COLUMNS), batch_id)
            accepted = classified.filter(status.isin(*RowStatus.to_output()))
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
                .withColumn("owner", owner_column(self.options.scope, self.reader())))

    def _mark_done(self, held: DataFrame, stats: BatchStats) -> None:
        # One task per core: a Python task has a fixed cost (its Python runner, a Redis
        # connection), and this pass is cheap per row.
        rows = (held.select("id", "owner", F.unix_millis("expires_at").alias("expires_at_ms"))
                .coalesce(self.spark.sparkContext.defaultParallelism))
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
