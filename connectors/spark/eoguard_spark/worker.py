"""What the executors' Python workers share: the settings a task gets, round trips kept in
flight, and the outbox acknowledgement pass (which the driver runs too, see :func:`ack_files`).

Plain Python over Arrow (no pyspark), like :mod:`eoguard_spark.claims` (the claim pass);
:mod:`eoguard_spark.dedup` wraps both into Spark passes. Each task opens one Redis client and
sends its ids ``batch_size`` per round trip through :class:`eoguard.store.dedup.DedupStore`
(one script call per hash slot), the very keys and rules a GuardedConsumer of the scope uses.
The done mark is not theirs: the driver marks the micro-batch's records done once the sinks
hold it (one call per batch, see :class:`eoguard_spark.batch.MicroBatchRunner`). The driver
runs the acknowledgement pass itself (:func:`ack_files`) when the batch's files are on its
own filesystem.
"""

from __future__ import annotations

import functools
import gc
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pyarrow as pa

from eoguard.credentials import redis_login
from eoguard.store.client import RedisClient, connect
from eoguard.store.dedup import DedupStore
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from eoguard.store.scripts import InFlight, Prepared, sends_ahead
from eoguard_spark.options import JobOptions

__all__ = ["IN_FLIGHT", "ClaimSettings", "ack_files", "ack_ids", "ack_partition",
           "freeze_loaded_objects", "in_flight"]

IN_FLIGHT = 3  # round trips a task keeps in flight (see in_flight)
T = TypeVar("T")
_ID_ONLY = pa.schema([("id", pa.string())])


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimSettings:
    """What an executor needs to reach the scope's dedup keys (pickled into each task)."""

    redis_url: str = field(repr=False)  # may hold a password
    key_prefix: str
    key_shards: int
    max_ttl_ms: int  # the prefix's: claim keys are clamped to it (plus grace)
    scope: str
    lease_ms: int
    grace_ms: int
    busy_wait_ms: int
    batch_size: int
    ack_outbox: bool
    # The micro-batch's claim pass (set per batch by the driver, see batch_token): its token,
    # and whether a done mark of it had landed before the pass (a replay of a done batch).
    token: str = ""
    token_done: bool = False
    # Whether the claims this pass leaves BUSY are given up for good under the token, so no
    # later attempt of its task takes them (claims.py): false only for a first pass whose BUSY
    # rows another pass settles.
    give_up_busy: bool = True
    # The Redis login the driver found in its environment (eoguard.credentials): executors
    # may not share that environment, so the tasks carry it.
    login: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, options: JobOptions) -> ClaimSettings:
        return cls(redis_url=options.redis_url, login=redis_login(options.redis_url, None, None),
                   key_prefix=options.key_prefix,
                   key_shards=options.key_shards, max_ttl_ms=options.max_ttl_ms,
                   scope=options.scope,
                   lease_ms=int(options.lease_s * 1000), grace_ms=int(options.grace_s * 1000),
                   busy_wait_ms=int(options.busy_wait_s * 1000),
                   batch_size=options.claim_batch_size, ack_outbox=options.ack_outbox)

    def first_pass(self) -> ClaimSettings:
        """These settings for a claim pass that waits on nothing and leaves its BUSY rows to a
        second pass, which waits on them and gives up those still BUSY for good."""
        return replace(self, busy_wait_ms=0, give_up_busy=False)

    def keyspace(self) -> KeySpace:
        return KeySpace(prefix=self.key_prefix, shards=self.key_shards, max_ttl_ms=self.max_ttl_ms)

    def connect(self) -> RedisClient:
        """A client of the scope's Redis: a single node or a cluster, as the server says."""
        return connect(self.redis_url, socket_timeout=30, socket_connect_timeout=10,
                       **self.login)

    def store(self, client: RedisClient) -> DedupStore:
        return DedupStore(client, scope=self.scope, keys=self.keyspace(),
                          lease_ms=self.lease_ms, grace_ms=self.grace_ms)


def in_flight(store: DedupStore, prepared: Iterable[Prepared[T]], doing: str,
              pool: ThreadPoolExecutor) -> Iterator[T]:
    """Send each prepared chunk as one round trip, up to ``IN_FLIGHT`` at a time (each on its
    own connection of the client's pool); the replies, in order.

    Redis (``appendfsync always``) syncs its log once per event-loop pass before it answers,
    and a pass reads at most 16 KB per connection: chunks in flight on several connections
    share those syncs instead of waiting for one each. On a single node each chunk is written
    at once (:meth:`DedupStore.send`: one buffer, packed by hiredis) and its reply read in
    turn; a cluster client hands out no connection of its own, so there each chunk runs on a
    thread of ``pool``.
    """
    threads = not sends_ahead(store.client)
    flight: deque[InFlight | Future[list[Any]]] = deque()

    def reply(item: InFlight | Future[list[Any]]) -> T:
        replies = item.result() if isinstance(item, Future) else item.wait()
        first: T = replies[0]
        return first

    try:
        for chunk in prepared:
            flight.append(pool.submit(store.run, [chunk], doing) if threads
                          else store.send([chunk], doing))
            if len(flight) >= IN_FLIGHT:
                yield reply(flight.popleft())
        while flight:
            yield reply(flight.popleft())
    finally:  # an error, or the caller stopped early: nothing more is read
        for item in flight:
            if isinstance(item, Future):
                item.cancel()  # one running already ends on its own thread
            else:
                item.discard()


@functools.cache
def freeze_loaded_objects() -> None:
    """Take the objects loaded so far out of this worker's garbage collections (once).

    PySpark's daemon runs ``gc.collect()`` after every task; with pyarrow, pandas, redis and
    eoguard loaded, each one walks every module's objects: ~40 ms of CPU per task, more than
    a small partition's claims cost. Objects loaded once stay alive anyway.
    """
    gc.freeze()


def ack_partition(settings: ClaimSettings, batches: Iterator[pa.RecordBatch]) -> int:
    """The acknowledgement pass of one Spark partition (see :func:`ack_ids`)."""
    freeze_loaded_objects()
    return ack_ids(settings, batches)


def ack_files(settings: ClaimSettings, directory: str) -> int:
    """:func:`ack_ids` over the ``id`` column of the Parquet files in ``directory`` (a committed
    batch on this machine's filesystem), read by pyarrow: the driver's pass, no Spark job.
    Files named ``_*`` and ``.*`` (commit markers, checksums) are not data and are skipped."""
    # Imported here: ~0.25 s, which the executors' workers (the other callers here) never need.
    from pyarrow.dataset import dataset  # noqa: PLC0415
    from pyarrow.fs import LocalFileSystem  # noqa: PLC0415

    files = dataset(directory, format="parquet", schema=_ID_ONLY, filesystem=LocalFileSystem())
    return ack_ids(settings, files.to_batches())


def ack_ids(settings: ClaimSettings, batches: Iterable[pa.RecordBatch]) -> int:
    """Acknowledge the senders' outbox records of the rows' ``id`` (the end-to-end ack a
    GuardedConsumer sends with its done mark); how many records there were."""
    acked = 0
    client = settings.connect()
    try:
        store = settings.store(client)
        outbox = Outbox(client, settings.keyspace())
        size = settings.batch_size

        def count(replies: list[Any]) -> int:
            return sum(int(reply) for reply in replies)

        def chunks() -> Iterator[Prepared[int]]:
            for batch in batches:
                ids: list[str] = batch.column("id").to_pylist()
                for start in range(0, len(ids), size):
                    yield Prepared(outbox.ack_calls(ids[start:start + size]), count)

        with ThreadPoolExecutor(IN_FLIGHT, "eoguard-redis") as pool:
            for replied in in_flight(store, chunks(), "acknowledging outbox records", pool):
                acked += replied
    finally:
        client.close()
    return acked
