"""One micro-batch of the job (``foreachBatch``): claims, sinks, ledger, done mark, acks.

:class:`MicroBatchRunner` is the function Spark calls per micro-batch; its docstring lists the
steps. The Redis mode's one pass over a batch is :mod:`eoguard_spark.one_pass`, the steps all
paths share are in :mod:`eoguard_spark.frames`, and :class:`BatchStats` (what each batch
reports to ``on_batch``) in :mod:`eoguard_spark.stats`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.types import StringType, StructField, StructType

from eoguard.callbacks import awaitable_refused, require_sync
from eoguard.envelope import now_ms
from eoguard.store.claim_policy import spark_policy
from eoguard.store.dedup import BatchState, DedupStore
from eoguard_spark.acks import AckQueue
from eoguard_spark.decode import OUTPUT_COLUMNS, RowStatus
from eoguard_spark.dedup import (
    ACK_COUNTS_SCHEMA,
    ClaimSettings,
    ack_partitions,
    batch_token,
    claim_status,
    position_column,
    settle_busy,
)
from eoguard_spark.frames import dead_letters, dead_letters_due, keep, status_counts
from eoguard_spark.lease import BatchLease
from eoguard_spark.one_pass import bounded, claim_into
from eoguard_spark.options import DedupMode, JobOptions
from eoguard_spark.sink import BatchLedger, ParquetBatchSink, query_id_of, resolve_reader
from eoguard_spark.stats import BatchStats
from eoguard_spark.worker import ack_files

__all__ = ["BatchProcessor", "BatchStats", "ForeachBatch", "MicroBatchRunner"]

log = logging.getLogger(__name__)

ForeachBatch = Callable[[DataFrame, int], None]

ID_ONLY = StructType([StructField("id", StringType())])
"""What the acknowledgement pass reads of a committed batch."""


class MicroBatchRunner:
    """The ``foreachBatch`` function. Per micro-batch ``N`` (Redis mode: under the token
    :func:`eoguard_spark.dedup.batch_token` derives from the reader, the query id and ``N``):

    Step 1. If the ledger says the sinks committed ``N`` (a crash hit after that), go to
            Step 5: nothing is claimed or written again.
    Step 2. Redis mode: claim the batch's ids on the executors at each record's position as
            this query's reader sees it (the reader being kept in the checkpoint); a claim
            this batch holds at another position is a duplicate at once. Claims another
            reader holds (BUSY) are resolved after the pass: a duplicate of a row this batch
            won is dropped, others are waited on and claimed again. If the batch's done mark
            had landed before (a replay that lost its ledger entry and its Parquet commit),
            its DONE_HERE rows are kept and rows it did not take the first time are left out
            (``stale``, ``busy``), so it writes what the first run wrote. The claim UDF must
            not run twice over a row: with a Parquet sink it runs inside the sink's write
            (one pass decodes, claims, counts and writes; see :mod:`eoguard_spark.one_pass`), without
            one the claimed rows are cached and counted by status. From here to the done
            mark the driver renews the batch's records every ``lease_s / 3``
            (:class:`eoguard_spark.lease.BatchLease`), so a slow batch keeps its claims.
    Step 3. The accepted rows to the Parquet sink: written to a temporary directory and
            renamed to ``batch_id=N`` (replace, never append); without a cache this is the
            one pass that decodes the batch, and counts it by status as it goes. Then the
            dead letters (malformed, expired) the same way, if there are any. If the
            Parquet sink committed ``N`` already, its rows are the batch's (and the dead
            letters are written if they were not).
    Step 4. The user's ``foreach_batch(rows, N)``; then the ledger records ``N``.
    Step 5. Redis mode: mark the batch's records done from the driver, one script call (per
            shard on Redis Cluster); only now can duplicates elsewhere in the scope be dropped
            for good. Then, unless ``ack_outbox`` is off, acknowledge the senders' outbox
            records of the rows the sinks hold: with a Parquet sink in the background, from
            the committed files, while the next batch runs (:mod:`eoguard_spark.acks`; the
            driver reads files on its own filesystem itself, see :meth:`_ack_committed`);
            else on the executors (one task per core).
    """

    def __init__(self, spark: SparkSession, options: JobOptions, *,
                 foreach_batch: ForeachBatch | None = None,
                 on_batch: Callable[[BatchStats], None] | None = None) -> None:
        require_sync(foreach_batch, "foreach_batch")
        require_sync(on_batch, "on_batch")
        self.spark = spark
        self.options = options
        # Typed to return object: what a hook returns is looked at (an awaitable is refused).
        self.foreach_batch: Callable[[DataFrame, int], object] | None = foreach_batch
        self.on_batch: Callable[[BatchStats], object] | None = on_batch
        self.settings = ClaimSettings.of(options)
        self.ledger = BatchLedger(spark, options.checkpoint)
        self._sinks: tuple[ParquetBatchSink | None, ParquetBatchSink | None] | None = None
        self._reader: str | None = None
        self._query_id: str | None = None
        self._dedup: DedupStore | None = None
        self._renewer: DedupStore | None = None
        self._acks: AckQueue | None = None  # background passes (with a Parquet sink)

    def reader(self) -> str:
        """This query's reader in its claim positions (recorded in the checkpoint; stable)."""
        if self._reader is None:
            self._reader = resolve_reader(self.spark, self.options.checkpoint, self.options.reader)
        return self._reader

    def query_id(self) -> str:
        """The query id Spark keeps in the checkpoint (stable across driver restarts)."""
        if self._query_id is None:
            self._query_id = query_id_of(self.spark, self.options.checkpoint)
        return self._query_id

    def token(self, batch_id: int) -> str:
        """The token of micro-batch ``batch_id``: the same for every attempt and replay."""
        return batch_token(self.reader(), self.query_id(), batch_id)

    def sinks(self) -> tuple[ParquetBatchSink | None, ParquetBatchSink | None]:
        """(output, dead letters), bound to the query id once the checkpoint has it."""
        if self._sinks is None:
            query_id = self.query_id()
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
        token = self.token(batch_id) if redis_mode else ""
        output = self.sinks()[0]
        cached: list[DataFrame] = []
        # Redis mode: the driver renews the batch's claims until its done mark has landed.
        lease = BatchLease(self._lease_store(), token, lease_ms=self.settings.lease_ms) \
            if redis_mode else None
        held: DataFrame | None  # the rows the sinks hold, if anything reads them
        try:
            with lease or nullcontext():
                if self.ledger.has(batch_id):  # Step 1.
                    stats.replayed = True
                    held = output.read(batch_id) if output else self._own_rows(df)
                else:
                    held = self._write(df, batch_id, token, stats, cached)
                    if self.foreach_batch is not None:  # Step 4.
                        assert held is not None, "_write reads the rows back for a hook"
                        with stats.phase("hook"):
                            returned = self.foreach_batch(held, batch_id)
                        refused = awaitable_refused(returned, "foreach_batch")
                        if refused is not None:  # it ran nothing: fail the batch (replayed)
                            raise refused
                    self.ledger.put(batch_id)
                if redis_mode:  # Step 5.
                    with stats.phase("done"):
                        self._mark_done(token, stats)
            if lease is not None:
                stats.lease_renewals = lease.renewals
            if redis_mode and self.options.ack_outbox:
                self._acknowledge(batch_id, held, stats)
        finally:
            for frame in cached:
                frame.unpersist()
        stats.duration_s = time.monotonic() - started
        log.info("eoguard batch %d: %s", batch_id, stats)
        if self.on_batch is not None:
            refused = awaitable_refused(self.on_batch(stats), "on_batch")
            if refused is not None:
                raise refused

    def _write(self, df: DataFrame, batch_id: int, token: str, stats: BatchStats,
               cached: list[DataFrame]) -> DataFrame | None:
        """Steps 2 and 3: returns the rows the sinks hold (None after the one pass when no hook
        reads them: the acknowledgement reads the committed files itself); adds cached frames
        to ``cached``."""
        output, dead = self.sinks()
        to_dead = RowStatus.to_dead_letter(expired=self.options.dead_letter_expired)
        status = F.col("status")
        if output is not None and output.committed(batch_id):
            stats.replayed = True
            if dead is not None and not dead.committed(batch_id):  # a crash between the two
                dead.write(dead_letters(df, to_dead), batch_id)
            return output.read(batch_id)

        redis_mode = self.options.dedup is DedupMode.REDIS
        settings = replace(self.settings, token=token,
                           token_done=redis_mode and self._is_done(token))
        if output is not None and redis_mode and bounded(self.options):
            schema = claim_into(output, dead, df, settings=settings, reader=self.reader(),
                                to_dead=to_dead, stats=stats, cached=cached)
            # Reading the batch back lists its files: only for a hook.
            return output.read(batch_id, schema) if self.foreach_batch is not None else None

        columns = list(OUTPUT_COLUMNS)
        with stats.phase("classify"):
            if redis_mode:  # Step 2, without a Parquet sink or with unbounded batches.
                positioned = df.withColumn("position", position_column(self.reader()))
                # The claim UDF is not deterministic: its rows are cached, never computed twice.
                classified = keep(positioned.withColumn(
                    "status", claim_status(settings.first_pass())), stats, cached)
                # A replay of a done batch waits on nothing: what it did not take the first
                # time it leaves out.
                waits = spark_policy(replay=settings.token_done).waits_on_busy
                if stats.rows.get(RowStatus.BUSY.value) and waits:
                    del stats.rows[RowStatus.BUSY.value]
                    # Only the few settled rows are cached again, not the whole batch.
                    settled = keep(settle_busy(classified, settings), stats, cached)
                    classified = (classified.filter(status != RowStatus.BUSY.value)
                                  .unionByName(settled))
                columns.append("position")
            elif output is None or self.options.dedup is DedupMode.WATERMARK:
                # The hook reads the rows (decode them once); or a state store update, which
                # the dead letters' pass would run again.
                classified = keep(df, stats, cached)
            else:  # decoded once, by the Parquet sink's pass (which counts them too)
                classified = df
        with stats.phase("sinks"):  # Step 3.
            counted = bool(cached)  # by keep()
            observation = Observation()
            observed = classified if counted else classified.observe(observation,
                                                                     *status_counts())
            accepted = classified.filter(status.isin(*RowStatus.to_output())).select(*columns)
            if output is not None:
                output.write(observed.filter(status.isin(*RowStatus.to_output()))
                             .select(*columns), batch_id)
            if not counted:
                stats.rows = {name: int(n) for name, n in observation.get.items() if n}
        if dead is not None and dead_letters_due(dead, stats, to_dead):
            with stats.phase("dead letters"):
                dead.write(dead_letters(classified, to_dead), batch_id)
        if output is not None and not cached and self.foreach_batch is not None:
            return output.read(batch_id)  # the hook reads the Parquet files: no second decode
        return accepted

    def _own_rows(self, df: DataFrame) -> DataFrame:
        """The rows this batch may have handled, when no Parquet sink keeps what it wrote:
        every ``ok`` row (only their ids are used: the outbox acknowledgement)."""
        return df.filter(F.col("status") == RowStatus.OK.value)

    def _store(self) -> DedupStore:
        """The scope's dedup store on the driver's own client (kept for the query's life)."""
        if self._dedup is None:
            self._dedup = self.settings.store(self.settings.connect())
        return self._dedup

    def _lease_store(self) -> DedupStore:
        """The store the lease thread renews through: its own client, beside the driver's."""
        if self._renewer is None:
            self._renewer = self.settings.store(self.settings.connect())
        return self._renewer

    def _is_done(self, token: str) -> bool:
        """Whether a done mark of the batch ``token`` landed already (on any shard)."""
        records = self._store().batch_records(token)
        return any(r is not None and r.state is BatchState.DONE for r in records)

    def _mark_done(self, token: str, stats: BatchStats) -> None:
        """Mark every batch record of ``token`` done (the executors released every claim
        whose row did not reach the sinks, so each claim still naming it is handled)."""
        store = self._store()
        before = store.batch_records(token)  # for the statistics only
        store.mark_done(token)
        now = now_ms()
        for record in before:
            if record is None:
                continue
            if record.state is BatchState.DONE:
                stats.records_already_done += 1
            else:
                stats.records_done += 1
                if record.at_ms <= now:
                    stats.records_lapsed += 1
        if stats.records_lapsed:
            log.warning("batch %d: the lease of %d of its records had lapsed before its done "
                        "mark (lease_s=%s too short for the batch?): another reader of the "
                        "scope may have taken claims over", stats.batch_id,
                        stats.records_lapsed, self.options.lease_s)

    def _acknowledge(self, batch_id: int, held: DataFrame | None, stats: BatchStats) -> None:
        """Step 5's acknowledgement. With a Parquet sink it reads the committed files in the
        background, while the next batch runs (:mod:`eoguard_spark.acks`); without one it
        reads ``held`` here: those rows come from this batch's source and cache, which only
        this call may read."""
        output = self.sinks()[0]
        if output is None:
            assert held is not None, "only the one pass, which needs a Parquet sink, keeps none"
            with stats.phase("ack"):
                stats.acked = self._ack(held)
            return
        stats.ack_deferred = True
        if self._acks is None:  # the first batch since the start: a crash may have cut the
            self._acks = AckQueue(self.query_id())  # pass of the batch before it short
            if batch_id > 0 and output.committed(batch_id - 1):
                self._acks.submit(batch_id - 1, self._ack_committed(output, batch_id - 1))
        with stats.phase("ack wait"):  # for the pass before this batch's, if still running
            self._acks.submit(batch_id, self._ack_committed(output, batch_id))

    def _ack_committed(self, output: ParquetBatchSink, batch_id: int) -> Callable[[], int]:
        """The acknowledgement pass over the files ``output`` committed for ``batch_id``.

        On the driver's own filesystem, with bounded batches, the pass thread reads their ids
        itself (:func:`eoguard_spark.worker.ack_files`): a Spark job's fixed cost (~0.17 CPU-s
        on two cores) is more than the work of 50,000 ids, and the files are right here.
        Elsewhere (HDFS, S3...) the executors read them: their ``id`` column alone (given as
        the schema, no file footer is read for it).
        """
        directory = output.local_dir(batch_id) if bounded(self.options) else None
        if directory is not None:
            return functools.partial(ack_files, self.settings, directory)
        return lambda: self._ack(output.read(batch_id, ID_ONLY))

    def _ack(self, held: DataFrame) -> int:
        """Acknowledge the senders' outbox records of the rows the sinks hold; how many."""
        # One task per core: a Python task has a fixed cost (its Python runner, a Redis
        # connection), and this pass is cheap per row.
        rows = held.select("id").coalesce(self.spark.sparkContext.defaultParallelism)
        # One row of counts per partition comes back (never the rows themselves).
        parts = rows.mapInArrow(ack_partitions(self.settings), ACK_COUNTS_SCHEMA).collect()
        return sum(int(part["acked"]) for part in parts)


BatchProcessor = MicroBatchRunner
"""The earlier name of :class:`MicroBatchRunner` (kept for code that imports it; the
consumer has a ``BatchProcessor`` of its own)."""
