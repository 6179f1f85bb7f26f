"""DataFrame steps every path of a micro-batch shares: counting rows by status, caching
what is read twice, and the dead letters."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from eoguard_spark.decode import DEAD_LETTER_COLUMNS, RowStatus
from eoguard_spark.sink import ParquetBatchSink
from eoguard_spark.stats import BatchStats

__all__ = ["dead_letters", "dead_letters_due", "keep", "status_counts"]


def status_counts() -> list[Column]:
    """Aggregates for ``DataFrame.observe``: the rows of each :class:`RowStatus`."""
    status = F.col("status")
    return [F.count(F.when(status == s.value, True)).alias(s.value) for s in RowStatus]


def keep(frame: DataFrame, stats: BatchStats, cached: list[DataFrame]) -> DataFrame:
    """Cache ``frame`` (later steps read it twice or more; added to ``cached``) and count it by
    status into ``stats.rows``, in one pass without a shuffle."""
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(frame)
    observation = Observation()
    frame.observe(observation, *status_counts()).write.format("noop").mode("overwrite").save()
    for name, count in observation.get.items():
        if count:
            stats.rows[name] = stats.rows.get(name, 0) + int(count)
    return frame


def dead_letters_due(dead: ParquetBatchSink, stats: BatchStats, to_dead: Sequence[str]) -> bool:
    """Whether the batch has dead letters for ``dead`` to write: rows counted with a
    dead-letter status (most batches have none: then no pass looks for them), and no commit
    of them yet (a replay after a crash between the output's commit and theirs)."""
    return any(stats.rows.get(s) for s in to_dead) and not dead.committed(stats.batch_id)


def dead_letters(frame: DataFrame, to_dead: Sequence[str]) -> DataFrame:
    """The dead-letter rows of ``frame``. A row that expired after the decode (its claim
    found it expired by Redis's clock) has no reason yet: it gets one saying so."""
    status = F.col("status")
    late = F.concat(F.lit("expired at "),
                    F.date_format("expires_at", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"),
                    F.lit(" (found when claimed, by Redis's clock)"))
    return (frame.filter(status.isin(*to_dead))
            .withColumn("reason", F.coalesce(
                F.col("reason"), F.when(status == RowStatus.EXPIRED.value, late)))
            .select(*DEAD_LETTER_COLUMNS))
