"""Redis mode with a Parquet sink: the claim UDF runs inside the sink's write, so a micro-batch
is decoded, claimed, counted and written in one pass, and nothing is cached.

The claim UDF must not run twice over a row (a second run would find the row's own claim).
So the pass claims without waiting and observes, beside the counts, where the few rows are
whose claim went against the decode: BUSY rows, and rows that expired by Redis's clock
between the decode and the claim. BUSY rows are then claimed again with the bounded wait
(only those rows, read again from the batch), and those taken over join the batch's files
before its commit; the late-expired ones go to the dead letters with a reason.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Observation, Row
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.types import StructType

from eoguard.store.claim_policy import spark_policy
from eoguard_spark.decode import OUTPUT_COLUMNS, RowStatus
from eoguard_spark.dedup import ClaimSettings, claim_status, position_column
from eoguard_spark.frames import dead_letters, dead_letters_due, keep, status_counts
from eoguard_spark.options import JobOptions
from eoguard_spark.sink import ParquetBatchSink
from eoguard_spark.stats import BatchStats

__all__ = ["ONE_PASS_MAX_ROWS", "bounded", "claim_into"]

ONE_PASS_MAX_ROWS = 200_000
"""The largest ``max_offsets_per_trigger`` the one pass is used with: the driver receives the
positions of a batch's BUSY and late-expired rows, usually none, but all of them when, say, a
replay long after its batch finds every row expired by Redis's clock, or another reader of the
scope holds the whole batch. A bound on the batch bounds that list (~60 MB of Python rows at
most); an unbounded batch takes the cached path, which settles them in place. The same bound
lets the driver acknowledge a committed batch itself (``MicroBatchRunner._ack_committed``): it
reads at most this many ids a pass."""

_DECODED = "_decoded"  # the status the decode gave, beside the claim's
_OUTCOMES = "_claim_outcomes"


def bounded(options: JobOptions) -> bool:
    """Whether a micro-batch of ``options`` has at most :data:`ONE_PASS_MAX_ROWS` records."""
    limit = options.max_offsets_per_trigger
    return limit is not None and limit <= ONE_PASS_MAX_ROWS


def claim_into(output: ParquetBatchSink, dead: ParquetBatchSink | None, df: DataFrame, *,
               settings: ClaimSettings, reader: str, to_dead: Sequence[str], stats: BatchStats,
               cached: list[DataFrame]) -> StructType:
    """Claim the decoded batch ``df`` under ``settings.token`` as it is written to ``output``
    (and its dead letters to ``dead``); returns the schema of the rows the sink holds.
    ``settings`` says whether the batch's done mark landed before (a replay: then nothing is
    waited on)."""
    to_output = RowStatus.to_output()
    status = F.col("status")
    columns = [*OUTPUT_COLUMNS, "position"]
    positioned = (df.withColumn("position", position_column(reader))
                  .withColumn(_DECODED, status))
    claimed = positioned.withColumn("status", claim_status(settings.first_pass()))
    observation = Observation()
    observed = claimed.observe(observation, *status_counts(), _claim_outcomes())
    settled: DataFrame | None = None
    with output.batch(stats.batch_id) as pending:
        with stats.phase("sinks"):
            pending.add(observed.filter(status.isin(*to_output)).select(*columns))
            counts = observation.get
        outcomes = counts.pop(_OUTCOMES) or []
        stats.rows = {name: int(n) for name, n in counts.items() if n}
        busy = [row for row in outcomes if row["status"] == RowStatus.BUSY.value]
        # A replay of a done batch waits on nothing: what it did not take the first time it
        # leaves out.
        if busy and spark_policy(replay=settings.token_done).waits_on_busy:
            with stats.phase("settle"):
                del stats.rows[RowStatus.BUSY.value]
                again = _rows_at(positioned, busy).withColumn("status", F.lit(RowStatus.OK.value))
                settled = keep(again.withColumn("status", claim_status(settings)), stats, cached)
                pending.add(settled.filter(status.isin(*to_output)).select(*columns))
        committing = time.monotonic()  # leaving output.batch() commits the batch's files
    stats.phases_s["commit"] = round(time.monotonic() - committing, 3)
    if dead is not None and dead_letters_due(dead, stats, to_dead):
        with stats.phase("dead letters"):
            frames = [df]  # rows the decode sent to the dead letters
            late = [row for row in outcomes if row["status"] == RowStatus.EXPIRED.value]
            if late:
                frames.append(_rows_at(df, late).withColumn(
                    "status", F.lit(RowStatus.EXPIRED.value)).withColumn("reason", F.lit(None)))
            if settled is not None:
                frames.append(settled.drop("position", _DECODED))
            dead.write(dead_letters(functools.reduce(DataFrame.unionByName, frames), to_dead),
                       stats.batch_id)
    assert pending.schema is not None, "the first add() above sets it"
    return pending.schema


def _claim_outcomes() -> Column:
    """An aggregate for ``DataFrame.observe``: where the rows are whose claim left them out
    for a reason the decode did not see (BUSY; expired by Redis's clock), with that status.
    Few in a batch, usually none: the driver reads them back (:func:`_rows_at`)."""
    status = F.col("status")
    late = (status == RowStatus.EXPIRED.value) & (F.col(_DECODED) == RowStatus.OK.value)
    return F.collect_list(F.when((status == RowStatus.BUSY.value) | late, F.struct(
        "topic", "partition", "offset", "status"))).alias(_OUTCOMES)


def _rows_at(frame: DataFrame, where: Sequence[Row]) -> DataFrame:
    """The rows of ``frame`` at the positions (topic, partition, offset) ``where`` names."""
    at = frame.sparkSession.createDataFrame(
        [(row["topic"], row["partition"], row["offset"]) for row in where],
        "topic string, partition int, offset long")
    return frame.join(F.broadcast(at), ["topic", "partition", "offset"], "left_semi")
