"""GuardedConsumer: each scope handles every unexpired message exactly once (DESIGN.md §1, §6).

Per batch (:meth:`GuardedConsumer.poll_once`; the steps' work lives in :mod:`eoguard.guard.batch`):

  Step 1. Consume up to ``batch_size`` records (without waiting while a batch is in hand).
  Step 2. Decode envelope and payload; a malformed record goes to the dead-letter topic at once.
  Step 3. Drop expired messages: counted, dead-lettered when configured.
  Step 4. Claim the batch in Redis: one script call per hash slot. The owner is the record's
          source position as this group reads it (scope|group|topic|partition|offset), so a
          record redelivered to the group re-owns its claim (MINE).
  Step 5. Run the handler on NEW / MINE / TAKEN_OVER; DONE is a duplicate and is skipped;
          PARTIAL (our own earlier attempt left effects half applied) is dead-lettered.
  Step 6. Produce the handlers' outputs (acks=all); then mark done, fenced, with the Redis
          effects in the same script, and acknowledge the senders' outbox records.
  Step 7. A failed message releases its claim and goes back to Step 4 after a backoff; past
          ``max_retries`` it is dead-lettered. A BUSY claim (another owner, live lease) goes
          back to Step 4 too, with a growing backoff bounded by that lease, until
          ``busy_wait_s``; then it is skipped: its owner's record is uncommitted elsewhere
          and gets handled or re-owned there.
  Step 8. Flush the dead letters, store the offsets, commit.

Batches overlap by one: the next batch is consumed and decoded before this one is handled, and
this batch's Step 6 round trip also carries the next batch's Step 4 (and, every ``lease_s / 3``,
the liveness heartbeat): one Redis round trip per batch. Offsets are stored only once the done
marks are confirmed; when ``poll_once`` returns, all it handled is done and its offsets stored
(committed asynchronously; an idle poll confirms the commit). A batch with failed or BUSY
messages finishes Step 7 before the next batch is claimed. Every claim held is renewed every
``lease_s / 3`` by a :class:`~eoguard.guard.lease.LeaseKeeper` thread until it is marked done or
released, so a slow batch keeps its claims; a claim lost anyway (the process stalled past its
lease) is reported by the done mark (fenced, never doubled).

Redis (or Kafka, for outputs and dead letters) failing in Steps 4-8: nothing more is committed,
the partitions are rewound to the first offsets held and re-read after a backoff; what was
done before the failure is then DONE, what was claimed is MINE. A rewind whose seek failed
holds back every record read past it until a retried seek takes (:mod:`eoguard.guard.rewind`).
A record may be dead-lettered twice. Rebalances run inside Step 1, when no round trip is in
flight: the claims held on revoked partitions are released, their records forgotten, and what
is done is committed; on lost partitions (another member may hold the same claims already)
the claims are only no longer renewed.
"""

from __future__ import annotations

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

from eoguard.codec import EnvelopeCodec, PayloadCodec, SchemaRegistry
from eoguard.config import ConsumerConfig
from eoguard.errors import BrokerError, ConfigError, ConsumerError, DeadLetterError, StoreError
from eoguard.guard.batch import Batch, BatchProcessor, ConsumerStats
from eoguard.guard.dead_letter import DeadLetterRouter
from eoguard.guard.handler import BatchHandler, ContextEnv, Handler
from eoguard.guard.lease import LeaseKeeper
from eoguard.guard.rewind import Rewinds
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
        self.config = config
        self._redis = redis if redis is not None else config.redis.connect()
        check_layout(self._redis, config.keyspace)  # a mismatched shard count would re-handle
        self._lease_ms = int(config.lease_s * 1000)
        self._dedup = DedupStore(self._redis, scope=config.scope, keys=config.keyspace,
                                 lease_ms=self._lease_ms, grace_ms=int(config.grace_s * 1000))
        self._liveness = Liveness(self._redis, config.keyspace, role="consumers")
        self._outbox = Outbox(self._redis, config.keyspace) if config.ack_outbox else None
        self._sink = DeliverySink(config.producer_kafka_config())
        self._dead = DeadLetterRouter(self._sink, topic=config.dead_letter, scope=config.scope)
        self.instance_id = config.instance_id or (
            f"{config.scope}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
        env = ContextEnv(config.scope, config.keyspace, isinstance(self._redis, RedisCluster),
                         self.instance_id, EnvelopeCodec(registry), PayloadCodec(registry))
        self._leases = LeaseKeeper(self._dedup, interval_s=config.lease_s / 3,
                                   max_hold_s=config.max_poll_interval_s)
        self._batch = BatchProcessor(config, dedup=self._dedup, outbox=self._outbox,
                                     sink=self._sink, dead=self._dead, env=env,
                                     leases=self._leases, handler=handler,
                                     batch_handler=batch_handler)
        self._stats = self._batch.stats
        self._claimed: Batch | None = None  # claims held, handled by the next poll
        self._next: Batch | None = None  # consumed and decoded, not claimed yet
        self._outage_s = 0.0
        self._beat_at = 0.0  # monotonic time of the next liveness heartbeat
        self._unconfirmed = False  # offsets committed asynchronously since the last sync commit
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
        """Handle one batch; returns the number of records this call consumed (it may read
        the next batch ahead: that one is handled by the next call)."""
        if self._closed:
            raise ConsumerError("poll after close")
        waiting = self._claimed is None and self._next is None
        raw = self._consume(self.config.poll_timeout_s if waiting else 0.0)  # Step 1.
        consumed = len(raw)
        try:
            if raw and self._claimed is None:
                self._absorb(raw)
                raw = []
            if self._claimed is None and self._next is not None:
                # A run of batches starts: claim this one on its own and read the next ahead,
                # whose claims then travel with this one's done marks.
                self._claimed, self._next = self._next, None
                [report] = self._round_trip([self._dedup.prepare_claim(self._claimed.claims())])
                self._batch.sort(self._claimed, report)  # Step 4.
                raw = self._consume(0.0)
                consumed += len(raw)
                if raw:
                    self._absorb(raw)
                    raw = []
            if self._claimed is None:  # nothing to handle (or a rebalance took it)
                self._when_idle()
                return consumed
            self._step(raw)
            raw = []
        except (StoreError, BrokerError, DeadLetterError) as exc:
            self._rewind(raw, exc)
        else:
            self._outage_s = 0.0
        return consumed

    def stats(self) -> ConsumerStats:
        in_flight = len(self._claimed.items) if self._claimed is not None else 0
        return replace(self._stats, claim_round_trips=self._dedup.round_trips,
                       in_flight=in_flight, dead_lettered=self._dead.routed,
                       lease_renewals=self._leases.renewals, leases_lost=self._leases.lost)

    def close(self) -> None:
        """Give back the claims held, leave the group (committing what is done), free the
        clients and drop the liveness lease."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drop_held(None)
            self._leases.close()
            self._kafka.close()
        finally:
            self._sink.close()
            try:
                self._liveness.deregister(self.instance_id)
            except StoreError as exc:
                log.warning("could not drop the liveness lease (it lapses by itself): %s", exc)

    def __enter__(self) -> GuardedConsumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # The pipeline ------------------------------------------------------------------------
    def _consume(self, timeout_s: float) -> list[Message]:
        msgs = self._kafka.consume(self.config.batch_size, timeout_s)
        if self._rewinds:
            msgs = self._rewinds.admit(msgs)
        self._stats.polled += len(msgs)
        return msgs

    def _absorb(self, raw: list[Message]) -> None:
        """Steps 2 and 3 for records just consumed: they join the batch not claimed yet."""
        batch = self._batch.decode(raw)
        if self._next is None:
            self._next = batch
        else:
            self._next.extend(batch)

    def _step(self, raw: list[Message]) -> None:
        """Steps 5-8 for the claimed batch; the next batch's Step 4 rides with Step 6, and
        ``raw`` (consumed after it) is decoded while that round trip is in flight."""
        batch, follow = self._claimed, self._next
        assert batch is not None
        ok, failed = self._batch.handle(batch.items)  # Steps 5 and 6 (outputs).
        ahead = follow is not None and not failed and not batch.busy
        prepared: list[Prepared[Any]] = [self._batch.prepare_done(ok)]
        if failed:
            prepared.append(self._dedup.prepare_release(self._batch.let_go(failed)))
        if ahead and follow is not None:
            prepared.append(self._dedup.prepare_claim(follow.claims()))
        flight = self._send(prepared)  # Step 6 (and the next batch's Step 4) ...
        try:
            later = self._batch.decode(raw) if raw else None  # ... while Redis runs it: 2-3
        finally:
            results = flight()  # read even when decoding failed: the connection goes back
        refused = self._batch.settle_done(ok, results[0])
        if refused:  # rare: effects refused; no claims are held ahead through the retries
            give_back = self._batch.let_go(refused)
            if ahead and follow is not None:
                give_back += self._batch.let_go(follow.items)
                ahead = False
            self._dedup.release(give_back)
        elif ahead and follow is not None:
            self._batch.sort(follow, results[-1])
        retry, wait_s = self._batch.plan(failed + refused, batch, handled_any=bool(ok))
        self._batch.finish(batch, retry, wait_s)  # Step 7, one round trip per retry round.
        self._dead.flush()  # Step 8.
        self._commit(batch.ends)
        self._claimed = follow if ahead else None
        if ahead:
            self._next = None
        if later is not None:
            if self._next is None:
                self._next = later
            else:
                self._next.extend(later)

    def _round_trip(self, prepared: list[Prepared[Any]]) -> list[Any]:
        """One Redis round trip for ``prepared``, with the liveness heartbeat when due."""
        return self._send(prepared)()

    def _send(self, prepared: list[Prepared[Any]]) -> Callable[[], list[Any]]:
        """Send :meth:`_round_trip`'s calls; the function returned reads their replies."""
        beat = time.monotonic() >= self._beat_at
        if beat:
            prepared = [*prepared, self._liveness.prepare_heartbeat(self.instance_id,
                                                                    self._lease_ms)]
        flight = self._dedup.send(prepared)

        def replies() -> list[Any]:
            results = flight.wait()
            if beat:
                self._beat_at = time.monotonic() + self.config.lease_s / 3
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
            self._unconfirmed = True

    def _when_idle(self) -> None:
        """Nothing to handle: confirm the last commit, renew the liveness lease when due."""
        # An asynchronous commit refused during a rebalance (ILLEGAL_GENERATION) is not
        # retried by librdkafka; a partition that receives nothing more would stay behind.
        if self._unconfirmed:
            self._commit_sync("commit failed (retried when idle again): %s")
        if time.monotonic() < self._beat_at:
            return
        self._beat_at = time.monotonic() + self.config.lease_s / 3
        try:
            self._liveness.heartbeat(self.instance_id, self._lease_ms)
        except StoreError as exc:
            log.warning("liveness heartbeat failed: %s", exc)

    # Failures and rebalances -------------------------------------------------------------
    def _rewind(self, raw: list[Message], exc: Exception) -> None:
        """Redis or Kafka failed: commit nothing more, re-read what is held after a backoff."""
        self._stats.store_outages += 1
        msgs = [m for b in (self._claimed, self._next) if b is not None for m in b.msgs] + raw
        self._claimed = self._next = None
        self._leases.drop_all()  # what was claimed is MINE when re-read
        first: dict[Partition, int] = {}
        for msg in msgs:
            tp, offset = (msg.topic() or "", msg.partition() or 0), msg.offset() or 0
            first[tp] = min(first.get(tp, offset), offset)
        cfg = self.config
        self._outage_s = min(max(self._outage_s * 2, cfg.retry_backoff_s), cfg.retry_backoff_max_s)
        log.warning("batch not committed (%s); re-reading it in %.2f s", exc, self._outage_s)
        self._rewinds.rewind(first)
        time.sleep(self._outage_s)

    def _drop_held(self, partitions: set[Partition] | None, *, release: bool = True) -> None:
        """Forget the records held of ``partitions`` (None: all) and release their claims
        (unless ``release`` is false: they stop being renewed and lapse)."""
        claimed, ahead = self._claimed, self._next
        held = []
        if claimed is not None:
            held = claimed.items if partitions is None else claimed.drop(partitions)
            self._claimed = None if partitions is None or not claimed.msgs else claimed
        if ahead is not None:
            if partitions is not None:
                ahead.drop(partitions)
            self._next = None if partitions is None or not ahead.msgs else ahead
        if partitions is not None:
            self._rewinds.forget(partitions)
        if not held:
            return
        claims = self._batch.let_go(held)
        if not release:
            return
        try:
            self._dedup.release(claims)
        except StoreError as exc:
            log.warning("could not release %d claims (their lease will lapse): %s", len(held), exc)

    def _on_revoke(self, partitions: list[Partition]) -> None:
        # Revocation is served inside consume(), between batches: what was handled is stored.
        self._drop_held(set(partitions))
        self._commit_sync("commit on revoke failed (records are re-read, then DONE): %s")

    def _commit_sync(self, on_failure: str) -> None:
        """Commit the stored offsets and wait; a failure is logged with ``on_failure``."""
        try:
            self._kafka.commit(asynchronous=False)
        except BrokerError as exc:
            log.warning(on_failure, exc)
        else:
            self._unconfirmed = False

    def _on_lost(self, partitions: list[Partition]) -> None:
        # Lost (session timeout): another member of the group may already read them, with
        # the same owner tokens, and hold these very claims as MINE: releasing would delete
        # its claims. Ours just stop being renewed.
        self._drop_held(set(partitions), release=False)
