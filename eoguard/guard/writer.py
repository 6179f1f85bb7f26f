"""The flusher's outbox work: write batches, hand persisted messages to Kafka, mark published.

Redis outages are absorbed here: a failed write puts the batch back at the front of its
line and retries with backoff (the queue fills, senders feel backpressure); messages that
expire while waiting fail with :class:`PersistError`.
"""

from __future__ import annotations

import logging
import time

from eoguard.config import ProducerConfig
from eoguard.errors import EoguardError, PersistError, StoreError
from eoguard.guard.callbacks import CallbackDispatcher, Settled
from eoguard.guard.messages import Counters, MessageState, PendingMessage
from eoguard.guard.outbox_queue import LogQueue
from eoguard.kafka.producer import KafkaProducer
from eoguard.store.outbox import Outbox, OutboxRecord

__all__ = ["OutboxWriter"]

log = logging.getLogger(__name__)

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 1.0


class OutboxWriter:
    """Outbox writes of one producer, and the health of the store as they see it."""

    def __init__(self, *, config: ProducerConfig, instance_id: str, delayed: bool,
                 queue: LogQueue, counters: Counters, kafka: KafkaProducer, outbox: Outbox,
                 dispatcher: CallbackDispatcher) -> None:
        self.config = config
        self.instance_id = instance_id
        self.delayed = delayed
        self.queue = queue
        self.counters = counters
        self.kafka = kafka
        self.outbox = outbox
        self.dispatcher = dispatcher
        self.store_available = True
        self.retry_at = 0.0  # monotonic time before which the store is not retried
        self._backoff_s = 0.0

    def persist(self, batch: list[PendingMessage]) -> None:
        """Write ``batch`` to the outbox in one round trip, then settle it.

        Step 1. Write the batch (on failure: back to the front of its line, retry later).
        Step 2. Guarantee each message (its on_guaranteed is queued now, before Kafka).
        Step 3. persist-first: line them up for librdkafka; delayed: free their memory.
        """
        q, c = self.queue, self.counters
        records = [OutboxRecord(id=m.handle.id, topic=m.handle.topic, key=m.key, value=m.value,
                                created_at_ms=m.created_at_ms, expires_at_ms=m.handle.expires_at_ms)
                   for m in batch]
        settled: list[Settled] = []
        # Step 1.
        try:
            result = self.outbox.put(records, owner=self.instance_id,
                                     keep_until=self.config.keep_until,
                                     resend_after_ms=self.config.resend_after_ms)
        except StoreError as exc:
            self.store_failed(exc)
            with q.lock:
                for m in batch:
                    if m.acked:  # delayed: Kafka acknowledged it meanwhile, nothing to write
                        m.persisting = False
                        if q.release_locked(m):
                            c.redis_writes_avoided += 1
                q.put_back_locked([m for m in batch if not m.acked], delayed=self.delayed)
                self._fail_expired_locked(settled)
                q.space.notify_all()
            self.dispatcher.submit(settled)
            return
        self.store_ok()
        expired = set(result.expired)
        with q.lock:
            for m in batch:
                m.persisting = False
                if m.handle.id in expired:
                    c.expired += 1
                    self._fail_locked(m, PersistError(
                        f"message {m.handle.id} expired before it could be persisted"), settled)
                    continue
                # Step 2.
                m.persisted = True
                c.persisted += 1
                if m.handle.settle(MessageState.GUARANTEED):
                    c.guaranteed += 1
                    settled.append((m, None))
                # Step 3.
                if self.delayed:
                    q.release_locked(m)
                    if m.acked:  # acknowledged while the write was in flight
                        q.publish_ids.append(m.handle.id)
                else:
                    q.to_produce.append(m)
            q.space.notify_all()
            if q.publish_ids:
                q.marks.notify()
        self.dispatcher.submit(settled)

    def produce_ready(self) -> bool:
        """persist-first: hand persisted messages to librdkafka while it takes them.

        Returns False when librdkafka's queue is full (Kafka slow or down): the rest waits,
        holding its room in the queue, while persisting goes on.
        """
        line = self.queue.to_produce
        done: list[PendingMessage] = []
        blocked = False
        while line:
            m = line[0]
            try:
                if not self.kafka.produce(m.handle.topic, m.value, m.key,
                                          on_delivery=m.delivered):
                    blocked = True
                    break
            except EoguardError as exc:
                log.error("Kafka refused %s at once; it stays pending in the outbox for "
                          "recovery: %s", m.handle.id, exc)
            line.popleft()
            done.append(m)
        if done:
            with self.queue.lock:
                for m in done:
                    self.queue.release_locked(m)
                self.queue.space.notify_all()
        return not blocked

    def mark_published(self, ids: list[str]) -> None:
        try:
            self.outbox.mark_published(ids)
        except StoreError as exc:
            self.store_failed(exc)
            with self.queue.lock:
                self.queue.publish_ids[:0] = ids  # retried: else recovery would resend them
            return
        self.store_ok()

    def flush_publish_marks(self) -> None:
        """One last attempt to mark acknowledged records published (on close)."""
        with self.queue.lock:
            ids, self.queue.publish_ids = self.queue.publish_ids, []
        if ids:
            self.mark_published(ids)

    def store_failed(self, exc: StoreError) -> None:
        if self.store_available:
            log.warning("the outbox is unavailable; retrying: %s", exc)
        self.store_available = False
        self._backoff_s = min(max(self._backoff_s * 2, _BACKOFF_MIN_S), _BACKOFF_MAX_S)
        self.retry_at = time.monotonic() + self._backoff_s

    def store_ok(self) -> None:
        if not self.store_available:
            log.warning("the outbox is available again")
        self.store_available = True
        self._backoff_s = 0.0
        self.retry_at = 0.0

    def _fail_locked(self, m: PendingMessage, error: EoguardError, settled: list[Settled]) -> None:
        if m.handle.settle(MessageState.FAILED, error):
            self.counters.failed += 1
            settled.append((m, error))
        self.queue.release_locked(m)

    def _fail_expired_locked(self, settled: list[Settled]) -> None:
        """Messages that expired while waiting for the outbox: failed, room released."""
        now_ms = time.time_ns() // 1_000_000
        for line in (self.queue.to_persist, self.queue.log):
            keep = [m for m in line if m.handle.expires_at_ms > now_ms or m.acked]
            for m in line:
                if m.handle.expires_at_ms <= now_ms and not m.acked:
                    self.counters.expired += 1
                    self._fail_locked(m, PersistError(f"message {m.handle.id} expired while "
                                                      "the outbox was unavailable"), settled)
            line.clear()
            line.extend(keep)
