"""Redis dedup on the executors: the scope's claims and done marks, per partition, batched.

The claim pass is an Arrow UDF over four narrow columns and the done pass a ``mapInArrow``
over ``(id, owner, expires_at_ms)``: rows stay on the executors, each Spark partition opens
one Redis connection, and ids go to Redis ``batch_size`` at a time through
:class:`eoguard.store.dedup.DedupStore` (one pipelined round trip per chunk, one script call
per hash slot), the very keys and claim rules a GuardedConsumer of the scope uses.

The owner of a claim is the record's source position ``scope|topic|partition|offset``
(:func:`eoguard.store.dedup.owner_token`): a replayed micro-batch or a retried task re-owns
its claims (MINE) however Spark partitions the replay; a true duplicate (same id, another
offset) is skipped once DONE, waited on while BUSY, and taken over once its lease lapsed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import redis
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import LongType, StructField, StructType

from connectors.spark.decode import RowStatus
from connectors.spark.options import JobOptions
from eoguard.store.dedup import Claim, ClaimResult, DedupStore, DoneResult
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox

__all__ = ["DONE_COUNTS_SCHEMA", "ClaimSettings", "claim_status", "mark_done_partitions",
           "owner_column", "resolve_busy"]

ArrowMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
ClaimInput = tuple[pa.Array, pa.Array, pa.Array, pa.Array]  # id, owner, expires_at_ms, status

_STATUS_OF = {
    ClaimResult.NEW: RowStatus.NEW.value,
    ClaimResult.MINE: RowStatus.MINE.value,
    ClaimResult.TAKEN_OVER: RowStatus.TAKEN_OVER.value,
    ClaimResult.DONE: RowStatus.DUPLICATE.value,
    ClaimResult.BUSY: RowStatus.BUSY.value,
    ClaimResult.EXPIRED: RowStatus.EXPIRED.value,
}
_BUSY_POLL_S = 0.5  # how often a BUSY claim is retried: the other owner may finish any time

DONE_COUNTS_SCHEMA = StructType([
    StructField("done", LongType()),
    StructField("already_done", LongType()),
    StructField("not_owned", LongType()),
])


def owner_column(scope: str) -> Column:
    """The claim owner of each row, ``scope|topic|partition|offset``, computed by Spark.

    Spells :func:`eoguard.store.dedup.owner_token` as a Column (a unit test pins the two
    together), so no per-row Python call is needed to build it.
    """
    return F.concat_ws("|", F.lit(scope), F.col("topic"), F.col("partition").cast("string"),
                       F.col("offset").cast("string"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimSettings:
    """What an executor needs to reach the scope's dedup keys (pickled into each task)."""

    redis_url: str
    key_prefix: str
    key_shards: int
    scope: str
    lease_ms: int
    grace_ms: int
    busy_wait_ms: int
    batch_size: int
    ack_outbox: bool

    @classmethod
    def of(cls, options: JobOptions) -> ClaimSettings:
        return cls(redis_url=options.redis_url, key_prefix=options.key_prefix,
                   key_shards=options.key_shards, scope=options.scope,
                   lease_ms=int(options.lease_s * 1000), grace_ms=int(options.grace_s * 1000),
                   busy_wait_ms=int(options.busy_wait_s * 1000),
                   batch_size=options.claim_batch_size, ack_outbox=options.ack_outbox)

    def keyspace(self) -> KeySpace:
        return KeySpace(prefix=self.key_prefix, shards=self.key_shards)

    def connect(self) -> redis.Redis[bytes]:
        return redis.Redis.from_url(self.redis_url, socket_timeout=30, socket_connect_timeout=10)

    def store(self, client: redis.Redis[bytes]) -> DedupStore:
        return DedupStore(client, scope=self.scope, keys=self.keyspace(),
                          lease_ms=self.lease_ms, grace_ms=self.grace_ms)


def _chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _claim_with_wait(store: DedupStore, claims: list[Claim], busy_wait_ms: int,
                     won: set[str]) -> list[str]:
    """Claim a chunk; BUSY claims are retried until ``busy_wait_ms``, then left BUSY.

    ``won`` holds the ids this partition already claimed; a BUSY copy of one of them is a
    duplicate at once (its holder is that copy), with no wait.
    """
    out = [RowStatus.BUSY.value] * len(claims)
    deadline = time.monotonic() + busy_wait_ms / 1000
    pending = list(range(len(claims)))
    while pending:
        outcomes = store.claim([claims[i] for i in pending])
        busy: list[int] = []
        lease_left_ms: list[int] = []
        for i, outcome in zip(pending, outcomes, strict=True):
            if outcome.result is ClaimResult.BUSY:
                busy.append(i)
                lease_left_ms.append(outcome.lease_ms)
                continue
            out[i] = _STATUS_OF[outcome.result]
            if outcome.result.should_handle:
                won.add(claims[i].message_id)
        still: list[int] = []
        for i in busy:
            if claims[i].message_id in won:
                out[i] = RowStatus.DUPLICATE.value
            else:
                still.append(i)
        left_s = deadline - time.monotonic()
        if not still or left_s <= 0:
            break
        time.sleep(min(left_s, _BUSY_POLL_S, min(lease_left_ms) / 1000 + 0.01))
        pending = still
    return out


def _claim_batches(settings: ClaimSettings) -> Callable[[Iterator[ClaimInput]], Iterator[pa.Array]]:
    def run(batches: Iterator[tuple[pa.Array, pa.Array, pa.Array, pa.Array]]
            ) -> Iterator[pa.Array]:
        client = settings.connect()
        try:
            store = settings.store(client)
            won: set[str] = set()
            for id_array, owner_array, expires_array, status_array in batches:
                status = status_array.to_pylist()
                ids = id_array.to_pylist()
                owners = owner_array.to_pylist()
                expires = expires_array.to_pylist()
                todo: list[int] = []
                for i, row_status in enumerate(status):
                    if row_status != RowStatus.OK.value:
                        continue
                    if ids[i] in won:
                        status[i] = RowStatus.DUPLICATE.value
                    else:
                        todo.append(i)
                for chunk in _chunks(todo, settings.batch_size):
                    claims = [Claim(ids[i], owners[i], expires[i]) for i in chunk]
                    outcomes = _claim_with_wait(store, claims, settings.busy_wait_ms, won)
                    for i, outcome in zip(chunk, outcomes, strict=True):
                        status[i] = outcome
                yield pa.array(status, pa.string())
        finally:
            client.close()

    return run


def claim_status(settings: ClaimSettings) -> Column:
    """The ``status`` column after claiming: an Arrow UDF over ``(id, owner, expires_at_ms,
    status)``, so only those four columns travel to Python, never the payload.

    Rows with status ``ok`` are claimed and get the claim's outcome (``new``, ``mine``,
    ``taken_over``, ``duplicate``, ``busy``, ``expired``); other rows keep their status. Every
    copy of an id is claimed until one copy in the partition wins; the copies after that are
    ``duplicate`` without a claim. Which copy wins is decided by Redis, so a replay re-owns
    the copy its earlier attempt claimed, however Spark partitions it. The UDF is
    non-deterministic, so Spark evaluates it once per row; cache its result before reuse.
    """
    # pyspark's stubs want functionType= for iterator UDFs; the type hints of the function
    # already say SCALAR_ITER (what Spark recommends), hence the Any.
    make_udf: Any = arrow_udf
    udf = make_udf(_claim_batches(settings), "string").asNondeterministic()
    column: Column = udf(F.col("id"), F.col("owner"), F.col("expires_at_ms"), F.col("status"))
    return column


def resolve_busy(claimed: DataFrame, settings: ClaimSettings) -> DataFrame:
    """Settle the BUSY rows of a claim pass made without waiting.

    A row whose id this very batch claimed at another position is a duplicate within the
    batch: its holder is marked done only after the sinks commit, so waiting on it is futile.
    Every other BUSY row is held outside the batch (a GuardedConsumer, another job) and is
    claimed again with the bounded wait (``busy_wait_ms``): taken over if the holder's lease
    lapses, a duplicate if the holder finishes, still ``busy`` (skipped) otherwise.
    """
    status = F.col("status")
    busy = claimed.filter(status == RowStatus.BUSY.value)
    winners = claimed.filter(status.isin(*RowStatus.to_output())).select("id")
    inside = (busy.join(winners, "id", "left_semi")
              .withColumn("status", F.lit(RowStatus.DUPLICATE.value)))
    outside = (busy.join(winners, "id", "left_anti")
               .withColumn("status", F.lit(RowStatus.OK.value)))
    again = outside.withColumn("status", claim_status(settings))
    rest = claimed.filter(status != RowStatus.BUSY.value)
    return rest.unionByName(inside).unionByName(again)


def mark_done_partitions(settings: ClaimSettings) -> ArrowMap:
    """The ``mapInArrow`` function of the done pass: rows ``(id, owner, expires_at_ms)`` in,
    one row of counts (:data:`DONE_COUNTS_SCHEMA`) per partition out.

    The done script is fenced: a claim that is no longer ours is NOT_OWNED (its lease lapsed
    and another owner took it over), one already done stays as it is. With ``ack_outbox`` the
    senders' outbox records are acknowledged in the same round trip, as a GuardedConsumer does.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts = dict.fromkeys(DoneResult, 0)
        client = settings.connect()
        try:
            store = settings.store(client)
            outbox = Outbox(client, settings.keyspace()) if settings.ack_outbox else None
            for batch in batches:
                ids = batch.column("id").to_pylist()
                owners = batch.column("owner").to_pylist()
                expires = batch.column("expires_at_ms").to_pylist()
                for chunk in _chunks(range(len(ids)), settings.batch_size):
                    claims = [Claim(ids[i], owners[i], expires[i]) for i in chunk]
                    extra = outbox.ack_calls([c.message_id for c in claims]) if outbox else []
                    for outcome in store.done(claims, extra=extra):
                        counts[outcome.result] += 1
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({
            "done": [counts[DoneResult.OK]],
            "already_done": [counts[DoneResult.ALREADY_DONE]],
            "not_owned": [counts[DoneResult.NOT_OWNED] + counts[DoneResult.EFFECT_ERROR]
                          + counts[DoneResult.ABSENT]],
        }, schema=pa.schema([("done", pa.int64()), ("already_done", pa.int64()),
                             ("not_owned", pa.int64())]))

    return run
