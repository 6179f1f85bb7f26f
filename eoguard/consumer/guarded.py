"""GuardedConsumer: each scope handles every unexpired message exactly once (docs/design.md §1, §6).

Per batch (:meth:`GuardedConsumer.poll_once`; the steps' work lives in :mod:`eoguard.consumer.batch`):

  Step 1. Consume up to ``batch_size`` records: wait for the first one only, then take what is
          already fetched (a lone message never waits for a full batch or a poll timeout).
  Step 2. Decode envelope and payload; a malformed record goes to the dead-letter topic at once.
  Step 3. Drop expired messages: counted, dead-lettered when configured.
  Step 4. Claim the batch in Redis under a token of its own: one script call (per hash slot
          on a cluster), one key written per message. A claim's position is the record as
          this group reads it (group, topic, partition, offset), so a record read again by
          the group re-owns its claim (MINE), or is DONE_HERE when its batch is done (its
          commit was lost).
  Step 5. Run the handler on NEW and MINE; a DUPLICATE is skipped, as is DONE_HERE; PARTIAL
          (our own earlier attempt left effects half applied) is dead-lettered.
  Step 6. Produce the handlers' outputs (acks=all); then, in one script call, apply each
          handled message's Redis effects (only where the claim still names the token), let
          go of the batch's other claims and mark the batch done; acknowledge the senders'
          outbox records in the same round trip.
  Step 7. A failed message goes back to Step 4 under a new token after a backoff; past
          ``max_retries`` it is dead-lettered. A BUSY claim (held at another position under a
          live lease) goes back to Step 4 too, with a growing backoff bounded by that lease,
          until ``busy_wait_s``; then it is skipped: its holder's record is uncommitted
          elsewhere and gets handled or re-owned there.
  Step 8. Flush the dead letters, store the offsets, commit.

Redis works while the consumer does: :mod:`eoguard.consumer.pipeline` sends each batch's
claims as soon as it is decoded and reads them two polls later, and a batch's done marks
travel with the claims of the batches decoded since; its module docstring has the timeline.
Offsets are stored in consume order, only once a batch's done marks are confirmed. The lease
is the batch's: :class:`~eoguard.consumer.leases.BatchLeases` renews every open batch record
every ``lease_s / 3`` (one write per batch and shard), from when its claims are sent until
its done marks are.

Redis (or Kafka, for outputs and dead letters) failing in Steps 4-8: nothing more is committed,
the partitions are rewound to the first offsets held and re-read after a backoff; what was
done before the failure is then DONE_HERE, what was claimed is MINE. A rewind whose seek failed
holds back every record read past it until a retried seek takes (:mod:`eoguard.consumer.rewind`).
Done marks Redis answered before it failed are counted and committed first. A record may be
dead-lettered twice. Rebalances run inside Step 1: the round trips land first, then the
records of the revoked or lost partitions are forgotten (a batch dropped whole is given back:
its lease ends now; the others release the dropped claims with their done marks, fenced), and
what is done is committed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from confluent_kafka import Message
from redis.cluster import RedisCluster

from eoguard.backoff import jittered
from eoguard.callbacks import require_sync
from eoguard.codec import EnvelopeCodec, PayloadCodec, SchemaRegistry
from eoguard.config import ConsumerConfig
from eoguard.consumer.batch import BatchProcessor
from eoguard.consumer.dead_letter import DeadLetterRouter
from eoguard.consumer.handler import BatchHandler, ContextEnv, Handler
from eoguard.consumer.leases import BatchLeases
from eoguard.consumer.pipeline import MARKING_WAIT_S, Pipeline
from eoguard.consumer.rewind import Rewinds
from eoguard.consumer.state import ConsumerStats
from eoguard.consumer.trace import TracedPipeline, TraceRecord
from eoguard.errors import (
    BrokerError,
    ConfigError,
    ConsumerClosedError,
    SecurityError,
    StoreError,
    UnavailableError,
)
from eoguard.kafka.consumer import KafkaConsumer, Partition
from eoguard.kafka.sink import DeliverySink
from eoguard.store.client import RedisClient
from eoguard.store.dedup import DedupStore
from eoguard.store.layout import check_layout
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox
from eoguard.store.scripts import Prepared

log = logging.getLogger(__name__)


class GuardedConsumer:
    """Wraps a confluent-kafka consumer in one scope; see the module docstring for the loop."""

    def __init__(self, config: ConsumerConfig, *, handler: Handler | None = None,
                 batch_handler: BatchHandler | None = None, redis: RedisClient | None = None,
                 registry: SchemaRegistry | None = None) -> None:
        if (handler is None) == (batch_handler is None):
            raise ConfigError("GuardedConsumer needs exactly one of handler= or batch_handler=")
        # Before any connection: nothing to close.
        require_sync(handler, "handler", instead="use AsyncGuardedConsumer, which awaits it")
        require_sync(batch_handler, "batch_handler")
        self.config = config
        self._owns_redis = redis is None and config.redis.client is None  # closed at close()
        self._redis = redis if redis is not None else config.redis.connect()
        wait = config.redis.replica_wait()  # replicated: done marks on a replica before commits
        # A mismatched shard count would re-handle; so would a done mark lost in a failover.
        check_layout(self._redis, config.keyspace, replicas=wait.replicas if wait else 0)
        self._lease_ms = int(config.lease_s * 1000)
        self._dedup = DedupStore(self._redis, scope=config.scope, keys=config.keyspace,
                                 lease_ms=self._lease_ms, grace_ms=int(config.grace_s * 1000),
                                 wait=wait)
        self._liveness = Liveness(self._redis, config.keyspace, role="consumers")
        self._outbox = Outbox(self._redis, config.keyspace) if config.ack_outbox else None
        self._sink = DeliverySink(config.producer_kafka_config())
        self._dead = DeadLetterRouter(self._sink, topic=config.dead_letter, scope=config.scope)
        self.instance_id = config.instance_id or (
            f"{config.scope}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
        framed = None if config.schema_registry is None else \
            config.schema_registry.payloads(registry)
        self._framed = framed  # closed at close()
        env = ContextEnv(config.scope, config.keyspace, isinstance(self._redis, RedisCluster),
                         self.instance_id, EnvelopeCodec(registry), PayloadCodec(registry),
                         framed)
        self._leases = BatchLeases(self._dedup, interval_s=config.lease_s / 3,
                                   max_hold_s=config.max_poll_interval_s)
        self._batch = BatchProcessor(config, dedup=self._dedup, outbox=self._outbox,
                                     sink=self._sink, dead=self._dead, env=env,
                                     leases=self._leases, send=self._send, handler=handler,
                                     batch_handler=batch_handler)
        self._stats = self._batch.stats
        pipeline = TracedPipeline if config.trace_messages else Pipeline  # no test when off
        self._pipe = pipeline(self._batch, self._dead, commit=self._commit,
                              light_below=max(1, config.batch_size // 4))
        self._callback_error: Exception | None = None  # raised by the next _consume
        self._orphans: list[Message] = []  # consumed when that error was raised
        self._outage_s = 0.0
        self._commit_owed = False  # an asynchronous commit failed: commit when idle
        self._beat_at = 0.0  # monotonic time of the next liveness heartbeat
        self._closed = False
        self._kafka = KafkaConsumer(config.kafka_config())
        self._kafka.subscribe(config.topics, on_revoke=self._on_revoke, on_lost=self._on_lost)
        self._rewinds = Rewinds(self._kafka)  # rewinds not taken yet: nothing passes them

    # Public API ------------------------------------------------------------------------
    def run(self, stop: threading.Event | Callable[[], bool] | None = None) -> None:
        """Poll until ``stop`` is set (or returns True), then close."""
        done = stop.is_set if isinstance(stop, threading.Event) else stop or (lambda: False)
        try:
            while not done():
                self.poll_once()
        finally:
            self.close()

    def poll_once(self) -> int:
        """Handle one batch; returns the number of records this call consumed (it reads up to
        three batches ahead: their claims are in flight while this one is handled).

        Redis or Kafka unavailable: the batch is re-read after a backoff. A refused login or
        an untrusted certificate (:class:`SecurityError`) is re-read too, and raised.
        """
        if self._closed:
            raise ConsumerClosedError("poll after close")
        raw: list[Message] = []
        consumed = 0
        try:
            pipe = self._pipe
            raw = self._consume(self._poll_wait(pipe))  # Step 1.
            consumed = len(raw)
            pipe.read_ahead(raw)  # Steps 2-3; the claims (Step 4) go with the next round trip
            more = bool(raw)
            raw = []
            while more and pipe.wants_more():  # a run starts: read ahead
                raw = self._consume(0.0)
                more = bool(raw)
                consumed += len(raw)
                pipe.read_ahead(raw)
                raw = []
            batch = pipe.next_batch()
            if batch is None:  # nothing to handle (or a rebalance took it)
                self._when_idle()
                return consumed
            pipe.handle(batch)  # Steps 5-6; Steps 7-8 when its done marks land
        except UnavailableError as exc:
            self._rewind(raw, exc)
            if isinstance(exc, SecurityError):
                raise  # wrong credentials or an untrusted certificate: a retry fails too
        else:
            self._outage_s = 0.0
        return consumed

    def stats(self) -> ConsumerStats:
        in_flight = sum(len(batch.items) for batch in self._pipe.held())
        return replace(self._stats, claim_round_trips=self._dedup.round_trips,
                       in_flight=in_flight, dead_lettered=self._dead.routed,
                       lease_renewals=self._leases.renewals)

    def trace(self) -> list[TraceRecord]:
        """Trace mode (``ConsumerConfig.trace_messages``): the stage stamps of the messages
        last committed, oldest first (:mod:`eoguard.consumer.trace`); empty when it is off.
        Call it on the thread that polls (or after close)."""
        pipe = self._pipe
        return pipe.ring.records() if isinstance(pipe, TracedPipeline) else []

    def close(self) -> None:
        """Give back the claims held, leave the group (committing what is done), free the
        clients and drop the liveness lease."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self._drop_held(None)
            except UnavailableError as exc:
                log.warning("closing with batches not done (re-read by the group): %s", exc)
            finally:
                self._abandon()  # whatever failed: flights read, connections back
                self._leases.close()
                self._kafka.close()
        finally:
            self._sink.close()
            if self._framed is not None:
                self._framed.close()
            try:
                self._liveness.deregister(self.instance_id)
            except StoreError as exc:
                log.warning("could not drop the liveness lease (it lapses by itself): %s", exc)
            if self._owns_redis:
                self._redis.close()  # every pooled connection, in use or not

    def __enter__(self) -> GuardedConsumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # The pipeline ------------------------------------------------------------------------
    def _poll_wait(self, pipe: Pipeline) -> float:
        """How long Step 1 waits for a record: the poll timeout when nothing is held, a moment
        when only done marks are in flight (they land meanwhile), else not at all."""
        if pipe.idle:
            return self.config.poll_timeout_s
        return min(MARKING_WAIT_S, self.config.poll_timeout_s) if pipe.marking_only else 0.0

    def _consume(self, timeout_s: float) -> list[Message]:
        # Wait for one record at most, then take what is fetched already: consume(n, t) would
        # wait the whole timeout for n records, and a trickle would wait with it.
        size = self.config.batch_size
        msgs = self._kafka.consume(1, timeout_s) if timeout_s > 0 else []
        if size > len(msgs) and (msgs or timeout_s <= 0):
            msgs += self._kafka.consume(size - len(msgs), 0.0)
        if self._rewinds:
            msgs = self._rewinds.admit(msgs)
        self._stats.polled += len(msgs)
        if self._callback_error is not None:  # a rebalance hook could not land the flights
            exc, self._callback_error = self._callback_error, None
            self._orphans = msgs  # re-read with the rest
            raise exc
        return msgs

    def _send(self, prepared: list[Prepared[Any]]) -> Callable[[], list[Any]]:
        """Send ``prepared`` (with the liveness heartbeat when due); the function returned
        reads their replies."""
        beat = time.monotonic() >= self._beat_at
        if beat:
            self._beat_at = time.monotonic() + self.config.lease_s / 3
            prepared = [*prepared, self._liveness.prepare_heartbeat(self.instance_id,
                                                                    self._lease_ms)]
        flight = self._dedup.send(prepared)

        def replies() -> list[Any]:
            started = time.perf_counter()
            try:
                results = flight.wait()
            finally:
                self._stats.redis_wait_s += time.perf_counter() - started
            if beat:
                results.pop()
            return results
        return replies

    def _commit(self, ends: dict[Partition, int]) -> None:
        if not ends:
            return
        try:
            self._kafka.store_offsets(ends)
            self._kafka.commit(asynchronous=True)
        except BrokerError as exc:  # the records come back and are found DONE
            log.warning("commit failed: %s", exc)
        else:
            self._stats.commits += 1

    def _when_idle(self) -> None:
        """Nothing to handle (no flight left either: the pipeline landed them looking for a
        batch): renew the liveness lease when due, then commit again what an asynchronous
        commit failed to. No blocking commit otherwise: at moderate load a consumer is idle
        between most batches, and a synchronous commit (a broker round trip, at times a
        second) would hold every record read meanwhile."""
        if time.monotonic() >= self._beat_at:  # first: a commit may wait on the coordinator
            self._beat_at = time.monotonic() + self.config.lease_s / 3
            try:
                self._liveness.heartbeat(self.instance_id, self._lease_ms)
            except StoreError as exc:
                log.warning("liveness heartbeat failed: %s", exc)
        # An asynchronous commit refused during a rebalance (ILLEGAL_GENERATION) is not
        # retried by librdkafka; a partition that receives nothing more would stay behind.
        # After such a failure, commit synchronously at every idle poll until one succeeds:
        # a member the coordinator dropped (UNKNOWN_MEMBER_ID after a broker pause) was seen
        # never to rejoin without these calls (chaos single seed 6).
        if self._kafka.take_commit_failure():
            self._commit_owed = True
        if self._commit_owed:
            self._commit_owed = not self._commit_sync(
                "commit failed (retried when idle again): %s")

    # Failures and rebalances -------------------------------------------------------------
    def _rewind(self, raw: list[Message], exc: Exception) -> None:
        """Redis or Kafka failed: commit nothing more, re-read what is held after a backoff."""
        self._stats.store_outages += 1
        # Done marks Redis answered before it failed are counted and committed, not re-read;
        # the rest is re-read (DONE_HERE or MINE then).
        with contextlib.suppress(UnavailableError):
            self._pipe.land_all()
        msgs = [m for b in self._pipe.held() for m in b.msgs] + raw + self._orphans
        self._abandon()
        first: dict[Partition, int] = {}
        for msg in msgs:
            tp, offset = (msg.topic() or "", msg.partition() or 0), msg.offset() or 0
            first[tp] = min(first.get(tp, offset), offset)
        cfg = self.config
        self._outage_s = min(max(self._outage_s * 2, cfg.retry_backoff_s), cfg.retry_backoff_max_s)
        wait_s = jittered(self._outage_s)  # the group's consumers re-read apart, not together
        log.warning("batch not committed (%s); re-reading it in %.2f s", exc, wait_s)
        self._rewinds.rewind(first)
        time.sleep(wait_s)

    def _abandon(self) -> None:
        """Forget every batch held, flights read and dropped: what was claimed is MINE and
        what was done is DONE_HERE when it is read again."""
        self._pipe.abandon()
        self._orphans = []
        self._leases.drop_all()

    def _drop_held(self, partitions: set[Partition] | None) -> None:
        """Land the round trips, then forget the records held of ``partitions`` (None: all).

        A batch dropped whole is given back (its lease ends now: one write per batch and
        shard); one keeping other records releases the dropped claims with its done marks.
        """
        self._pipe.land_all()  # the claims sent are held now, the done marks committed
        dropped = self._pipe.drop(partitions)
        if partitions is not None:
            self._rewinds.forget(partitions)
        if not dropped:
            return
        self._leases.drop(*(batch.token for batch in dropped))
        records = [record for batch in dropped
                   for record in self._dedup.records(batch.token, [i.claim for i in batch.claimed])]
        try:
            self._dedup.give_back(records)
        except StoreError as exc:
            log.warning("could not give back %d batches (their leases will lapse): %s",
                        len(dropped), exc)

    def _forget(self, partitions: set[Partition], exc: Exception) -> None:
        """A rebalance hook could not land the flights: drop the records of ``partitions``
        everywhere (their claims lapse) and have the next consume rewind the rest."""
        self._pipe.forget(partitions)
        self._rewinds.forget(partitions)
        self._callback_error = exc

    def _on_revoke(self, partitions: list[Partition]) -> None:
        # Served inside consume(), between batches: flights land, what is done is stored.
        try:
            self._drop_held(set(partitions))
        except UnavailableError as exc:
            self._forget(set(partitions), exc)
        self._commit_sync("commit on revoke failed (records are re-read, then DONE): %s")

    def _commit_sync(self, on_failure: str) -> bool:
        """Commit the stored offsets and wait; a failure is logged with ``on_failure``."""
        try:
            self._kafka.commit(asynchronous=False)
        except BrokerError as exc:
            log.warning(on_failure, exc)
            return False
        return True

    def _on_lost(self, partitions: list[Partition]) -> None:
        # Lost (session timeout): another member of the group may already read them and hold
        # these very records as MINE, under its own token: what we give back or release is
        # fenced by our token, so it never touches its claims.
        try:
            self._drop_held(set(partitions))
        except UnavailableError as exc:
            self._forget(set(partitions), exc)
