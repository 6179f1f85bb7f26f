"""GuardedConsumer: each scope handles every unexpired message exactly once (DESIGN.md §1, §6).

Per batch (:meth:`GuardedConsumer.poll_once`; Steps 2-7 live in :mod:`eoguard.guard.batch`):

  Step 1. Consume up to ``batch_size`` records.
  Step 2. Decode envelope and payload; a malformed record goes to the dead-letter topic at once.
  Step 3. Drop expired messages: counted, dead-lettered when configured.
  Step 4. Claim the batch in Redis: one round trip, one script call per hash slot. The owner
          is the record's source position, so a redelivered record re-owns its claim (MINE).
  Step 5. Run the handler on NEW / MINE / TAKEN_OVER; DONE is a duplicate and is skipped.
  Step 6. Produce the handlers' outputs (acks=all); then mark done, fenced, with the Redis
          effects in the same script, and acknowledge the senders' outbox records: one round
          trip.
  Step 7. A failed message releases its claim and goes back to Step 4 after a backoff; past
          ``max_retries`` it is dead-lettered. A BUSY claim (another owner, live lease) goes
          back to Step 4 too, after its lease, until ``busy_wait_s``; then it is skipped: its
          owner's record is uncommitted elsewhere and gets handled or re-owned there.
  Step 8. Flush the dead letters, store the offsets, commit.

Redis (or Kafka, for outputs and dead letters) failing in Steps 4-8: nothing is committed, the
partitions are rewound to the batch's first offsets and re-read after a backoff; what was done
before the failure is then DONE, what was claimed is MINE. A record may be dead-lettered twice.
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

from confluent_kafka import Message
from redis.cluster import RedisCluster

from eoguard.codec import EnvelopeCodec, PayloadCodec, SchemaRegistry
from eoguard.config import ConsumerConfig
from eoguard.errors import (
    BrokerError,
    ConfigError,
    ConsumerError,
    DeadLetterError,
    StoreError,
)
from eoguard.guard.batch import BatchProcessor, ConsumerStats
from eoguard.guard.dead_letter import DeadLetterRouter
from eoguard.guard.handler import BatchHandler, ContextEnv, Handler
from eoguard.kafka.consumer import KafkaConsumer, Partition
from eoguard.kafka.sink import DeliverySink
from eoguard.store.client import RedisClient
from eoguard.store.dedup import DedupStore
from eoguard.store.outbox import Outbox

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
        self._cluster = isinstance(self._redis, RedisCluster)
        self._dedup = DedupStore(self._redis, scope=config.scope, keys=config.keyspace,
                                 lease_ms=int(config.lease_s * 1000),
                                 grace_ms=int(config.grace_s * 1000))
        self._outbox = Outbox(self._redis, config.keyspace) if config.ack_outbox else None
        self._codec, self._payloads = EnvelopeCodec(registry), PayloadCodec(registry)
        self._sink = DeliverySink(config.producer_kafka_config())
        self._dead = DeadLetterRouter(self._sink, topic=config.dead_letter, scope=config.scope)
        self.instance_id = config.instance_id or (
            f"{config.scope}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
        env = ContextEnv(config.scope, config.keyspace, self._cluster, self.instance_id,
                         self._codec, self._payloads)
        self._batch = BatchProcessor(config, dedup=self._dedup, outbox=self._outbox,
                                     sink=self._sink, dead=self._dead, env=env, handler=handler,
                                     batch_handler=batch_handler, codec=self._codec,
                                     payloads=self._payloads)
        self._stats = self._batch.stats
        self._outage_s = 0.0
        self._closed = False
        self._kafka = KafkaConsumer(config.kafka_config())
        self._kafka.subscribe(config.topics, on_revoke=self._on_revoke, on_lost=self._on_lost)

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
        """Consume and process one batch; returns the number of records consumed."""
        if self._closed:
            raise ConsumerError("poll after close")
        msgs = self._kafka.consume(self.config.batch_size, self.config.poll_timeout_s)  # Step 1.
        if not msgs:
            return 0
        self._stats.polled += len(msgs)
        try:
            self._batch.process(msgs)  # Steps 2-7.
            self._dead.flush()  # Step 8.
        except (StoreError, BrokerError, DeadLetterError) as exc:
            self._rewind(msgs, exc)
            return len(msgs)
        finally:
            self._batch.in_flight = []
        self._outage_s = 0.0
        # A batch holds each partition's records in offset order: the last one is the highest.
        next_offsets = {(m.topic() or "", m.partition() or 0): (m.offset() or 0) + 1 for m in msgs}
        try:
            self._kafka.store_offsets(next_offsets)
            self._kafka.commit(asynchronous=True)
        except BrokerError as exc:  # the records come back and are found DONE
            log.warning("commit failed: %s", exc)
        else:
            self._stats.commits += 1
        return len(msgs)

    def stats(self) -> ConsumerStats:
        return replace(self._stats, claim_round_trips=self._dedup.round_trips,
                       in_flight=len(self._batch.in_flight), dead_lettered=self._dead.routed)

    def close(self) -> None:
        """Leave the group (committing what is done), then flush and free the clients."""
        if self._closed:
            return
        self._closed = True
        self._kafka.close()
        self._sink.close()

    def __enter__(self) -> GuardedConsumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # Failures and rebalances -------------------------------------------------------------
    def _rewind(self, msgs: list[Message], exc: Exception) -> None:
        """Redis or Kafka failed mid-batch: commit nothing, re-read the batch after a backoff."""
        self._stats.store_outages += 1
        first: dict[Partition, int] = {}
        for msg in msgs:
            tp = (msg.topic() or "", msg.partition() or 0)
            first[tp] = min(first.get(tp, msg.offset() or 0), msg.offset() or 0)
        cfg = self.config
        self._outage_s = min(max(self._outage_s * 2, cfg.retry_backoff_s), cfg.retry_backoff_max_s)
        log.warning("batch not committed (%s); re-reading it in %.2f s", exc, self._outage_s)
        try:
            self._kafka.seek(first)
        except BrokerError as seek_exc:
            log.warning("rewind failed (%s); the uncommitted batch is re-read after a "
                        "rebalance or restart", seek_exc)
        time.sleep(self._outage_s)

    def _release_in_flight(self, partitions: list[Partition]) -> None:
        lost = set(partitions)
        in_flight = self._batch.in_flight
        mine = [item for item in in_flight if (item.topic, item.partition) in lost]
        if not mine:
            return
        try:
            self._dedup.release([item.claim for item in mine])
        except StoreError as exc:
            log.warning("could not release %d claims (their lease will lapse): %s", len(mine), exc)
        self._batch.in_flight = [item for item in in_flight if item not in mine]

    def _on_revoke(self, partitions: list[Partition]) -> None:
        # Revocation is served inside consume(), between batches: what was handled is stored.
        self._release_in_flight(partitions)
        try:
            self._kafka.commit(asynchronous=False)
        except BrokerError as exc:
            log.warning("commit on revoke failed (records are re-read, then DONE): %s", exc)

    def _on_lost(self, partitions: list[Partition]) -> None:
        self._release_in_flight(partitions)
