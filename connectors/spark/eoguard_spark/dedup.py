"""Redis dedup as Spark columns and passes: the owner column, the claim UDF, the done pass.

The claim pass is an Arrow UDF over four narrow columns and the done pass a ``mapInArrow``
over ``(id, owner, expires_at_ms)``: rows stay on the executors, where
:mod:`eoguard_spark.claims` talks to Redis per partition, batched.

The owner of a claim is the record's source position as this query reads it,
``scope|reader|topic|partition|offset`` (:func:`eoguard.store.dedup.owner_token`; the reader
names the query and is kept in its checkpoint): a replayed micro-batch or a retried task
re-owns its claims (MINE) however Spark partitions the replay; a true duplicate (same id,
another offset) or the same record read by another reader of the scope (a GuardedConsumer's
group) is skipped once DONE, waited on while BUSY, and taken over once its lease lapsed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import LongType, StructField, StructType

from eoguard.store.dedup import DoneResult
from eoguard_spark.claims import claim_partition
from eoguard_spark.decode import RowStatus
from eoguard_spark.worker import ClaimSettings, done_partition

__all__ = ["DONE_COUNTS_SCHEMA", "ClaimSettings", "claim_status", "mark_done_partitions",
           "owner_column", "resolve_busy"]

ArrowMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

DONE_COUNTS_SCHEMA = StructType([
    StructField("done", LongType()),
    StructField("already_done", LongType()),
    StructField("not_owned", LongType()),
])


def owner_column(scope: str, reader: str) -> Column:
    """The claim owner of each row, ``scope|reader|topic|partition|offset``, computed by Spark.

    Spells :func:`eoguard.store.dedup.owner_token` as a Column (a test pins the two
    together), so no per-row Python call is needed to build it.
    """
    return F.concat_ws("|", F.lit(scope), F.lit(reader), F.col("topic"),
                       F.col("partition").cast("string"), F.col("offset").cast("string"))


def claim_status(settings: ClaimSettings) -> Column:
    """The ``status`` column after claiming: an Arrow UDF over ``(id, owner, expires_at_ms,
    status)``, so only those four columns travel to Python, never the payload.

    Rows with status ``ok`` are claimed and get the claim's outcome (``new``, ``mine``,
    ``taken_over``, ``duplicate``, ``busy``, ``expired``); other rows keep their status. Every
    copy of an id is claimed until one copy wins; the copies after that are ``duplicate``, and
    so is a copy whose claim is held by this query at another position (a copy elsewhere in
    the batch). Which copy wins is decided by Redis, so a replay re-owns the copy its earlier
    attempt claimed, however Spark partitions it. The UDF is non-deterministic, so Spark
    evaluates it once per row; cache its result before reuse.
    """

    def claim(batches: Iterator[tuple[pa.Array, pa.Array, pa.Array, pa.Array]]
              ) -> Iterator[pa.Array]:
        yield from claim_partition(settings, batches)

    # pyspark's stubs want functionType= for iterator UDFs; the type hints of the function
    # already say SCALAR_ITER (what Spark recommends), hence the Any.
    make_udf: Any = arrow_udf
    udf = make_udf(claim, "string").asNondeterministic()
    column: Column = udf(F.col("id"), F.col("owner"), F.col("expires_at_ms"), F.col("status"))
    return column


def resolve_busy(claimed: DataFrame, settings: ClaimSettings) -> DataFrame:
    """The BUSY rows of a claim pass made without waiting, settled (only those rows).

    BUSY rows are held by another reader of the scope (a GuardedConsumer, another job); the
    claim pass settled those held by this query already. A row whose id this batch won at
    another position meanwhile (the holder's lease lapsed) is a duplicate within the batch.
    Every other row is claimed again with the bounded wait (``busy_wait_ms``): taken over if
    the holder's lease lapses, a duplicate if the holder finishes, still ``busy`` (skipped)
    otherwise.
    """
    status = F.col("status")
    busy = claimed.filter(status == RowStatus.BUSY.value)
    winners = claimed.filter(status.isin(*RowStatus.to_output())).select("id")
    inside = (busy.join(winners, "id", "left_semi")
              .withColumn("status", F.lit(RowStatus.DUPLICATE.value)))
    outside = (busy.join(winners, "id", "left_anti")
               .withColumn("status", F.lit(RowStatus.OK.value)))
    return inside.unionByName(outside.withColumn("status", claim_status(settings)))


def mark_done_partitions(settings: ClaimSettings) -> ArrowMap:
    """The ``mapInArrow`` function of the done pass: rows ``(id, owner, expires_at_ms)`` in,
    one row of counts (:data:`DONE_COUNTS_SCHEMA`) per partition out.

    The done script is fenced: a claim that is no longer ours is NOT_OWNED (its lease lapsed
    and another owner took it over), one already done stays as it is. With ``ack_outbox`` the
    senders' outbox records are acknowledged in the same round trip, as a GuardedConsumer does.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts = done_partition(settings, batches)
        yield pa.RecordBatch.from_pydict({
            "done": [counts[DoneResult.OK]],
            "already_done": [counts[DoneResult.ALREADY_DONE]],
            "not_owned": [counts.total() - counts[DoneResult.OK]  # NOT_OWNED, ABSENT, ...
                          - counts[DoneResult.ALREADY_DONE]],
        }, schema=pa.schema([("done", pa.int64()), ("already_done", pa.int64()),
                             ("not_owned", pa.int64())]))

    return run
