"""Redis dedup as Spark columns and passes: the position column, the batch token, the claim
UDF, and the outbox acknowledgement pass.

The claim pass is an Arrow UDF over four narrow columns and the acknowledgement pass a
``mapInArrow`` over ``id``: rows stay on the executors, where :mod:`eoguard_spark.claims` talks
to Redis per partition, batched.

A claim names its claim pass (the micro-batch's token, derived from the query's reader, its
query id and the batch id: :func:`batch_token`) and the record's position as this query reads
it (:func:`position_column`; the reader names the query and is kept in its checkpoint). A task
retry, a speculative task and a replayed micro-batch claim under the same token at the same
positions, so they re-own their claims (MINE) however Spark partitions the replay; a true
duplicate (same id, another offset) or the same record read by another reader of the scope (a
GuardedConsumer's group) is skipped once done, waited on while BUSY (then given up for good
under the token, so every attempt of the task leaves it out: :mod:`eoguard_spark.claims`), and
taken over once its lease lapsed. The lease and the done mark are the batch's: the driver marks the batch's
records done once the sinks hold it (:meth:`eoguard.store.dedup.DedupStore.mark_done`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import LongType, StructField, StructType

from eoguard_spark.claims import ClaimInput, claim_partition
from eoguard_spark.decode import RowStatus
from eoguard_spark.worker import ClaimSettings, ack_partition

__all__ = ["ACK_COUNTS_SCHEMA", "ClaimSettings", "ack_partitions", "batch_token", "claim_status",
           "position_column", "settle_busy", "shard_column"]

ArrowMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

ACK_COUNTS_SCHEMA = StructType([StructField("acked", LongType())])


def batch_token(reader: str, query_id: str, batch_id: int) -> str:
    """The token of micro-batch ``batch_id`` of a query: 16 hex digits of a SHA-256 over its
    reader, query id and batch id (length-prefixed: a reader may hold any character).

    The same for every task attempt, speculative copy and replay of the batch, so they re-own
    its claims; another batch, query or reader gets another token.
    """
    text = f"{len(reader)}:{reader}|{len(query_id)}:{query_id}|{batch_id}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def position_column(reader: str) -> Column:
    """The claim position of each row, computed by Spark: :func:`eoguard.store.dedup.position`
    of ``reader`` and the row's topic, partition and offset, spelled as a Column (a test pins
    the two together), so no per-row Python call is needed to build it.

    ``length`` counts characters as Python's ``len`` does (code points), so the length prefixes
    match for any topic and reader name.
    """
    return F.concat(F.lit(f"{len(reader)}:{reader}|"), F.length("topic").cast("string"),
                    F.lit(":"), F.col("topic"), F.lit("|"), F.col("partition").cast("string"),
                    F.lit("|"), F.col("offset").cast("string"))


def shard_column(shards: int) -> Column:
    """The shard of each row's id, computed by Spark: :meth:`eoguard.store.keys.KeySpace.shard_of`
    (CRC-32 of the id's UTF-8 bytes, modulo ``shards``) spelled as a Column (a test pins the
    two together), so the claim pass hashes no id in Python."""
    return F.pmod(F.crc32(F.col("id").cast("binary")), F.lit(shards))


def claim_status(settings: ClaimSettings) -> Column:
    """The ``status`` column after claiming: an Arrow UDF over ``(id, position,
    expires_at_ms, status, shard)``, so only those five narrow columns travel to Python,
    never the payload.

    Rows with status ``ok`` are claimed under ``settings.token`` and get the claim's outcome
    (``new``, ``mine``, ``done_here``, ``duplicate``, ``busy``, ``expired``, ``stale``: see
    :mod:`eoguard_spark.claims`); other rows keep their status. Every copy of an id is claimed
    until one copy wins; the copies after that are ``duplicate``, and so is a copy whose claim
    is held by this batch's token at another position (a copy elsewhere in the batch). Which
    copy wins is decided by Redis, so a replay re-owns the copy its earlier attempt claimed,
    however Spark partitions it. The UDF is non-deterministic, so Spark evaluates it once per
    row; cache its result before reuse, or claim inside the pass that writes it.
    """

    def claim(batches: Iterator[ClaimInput]) -> Iterator[pa.Array]:
        yield from claim_partition(settings, batches)

    # pyspark's stubs want functionType= for iterator UDFs; the type hints of the function
    # already say SCALAR_ITER (what Spark recommends), hence the Any.
    make_udf: Any = arrow_udf
    udf = make_udf(claim, "string").asNondeterministic()
    column: Column = udf(F.col("id"), F.col("position"), F.col("expires_at_ms"), F.col("status"),
                         shard_column(settings.key_shards))
    return column


def settle_busy(claimed: DataFrame, settings: ClaimSettings) -> DataFrame:
    """The BUSY rows of a claim pass made without waiting, settled (only those rows).

    BUSY rows are held by another reader of the scope (a GuardedConsumer, another job); the
    claim pass settled those held by this batch's token already. A row whose id this batch won
    at another position meanwhile (the holder's lease lapsed) is a duplicate within the batch.
    Every other row is claimed again with the bounded wait (``busy_wait_ms``): taken over
    (``new``) if the holder's lease lapses, a duplicate if the holder finishes, still ``busy``
    (skipped) otherwise.
    """
    status = F.col("status")
    busy = claimed.filter(status == RowStatus.BUSY.value)
    winners = claimed.filter(status.isin(*RowStatus.to_output())).select("id")
    inside = (busy.join(winners, "id", "left_semi")
              .withColumn("status", F.lit(RowStatus.DUPLICATE.value)))
    outside = (busy.join(winners, "id", "left_anti")
               .withColumn("status", F.lit(RowStatus.OK.value)))
    return inside.unionByName(outside.withColumn("status", claim_status(settings)))


def ack_partitions(settings: ClaimSettings) -> ArrowMap:
    """The ``mapInArrow`` function of the acknowledgement pass: rows ``(id)`` in, one row of
    counts (:data:`ACK_COUNTS_SCHEMA`) per partition out.

    Acknowledges the senders' outbox records of the rows the sinks hold, as a GuardedConsumer
    does with its done mark: their producers stop resending them.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        acked = ack_partition(settings, batches)
        yield pa.RecordBatch.from_pydict({"acked": [acked]},
                                         schema=pa.schema([("acked", pa.int64())]))

    return run
