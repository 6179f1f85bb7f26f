"""The flusher's outbox work: write batches, hand persisted messages to Kafka, mark published.

A batch and the publish marks gathered meanwhile go to Redis together, in one round trip and
one script call (so one AOF fsync). Writes run on one Redis thread, in the order started, so
the flusher can start the next write while one is in flight: Redis works on one batch while
the flusher settles and produces the one before. Writes are finished in the order started.

Redis outages are absorbed here: a failed write puts its batch, and the batches of every write
started after it, back at the front of their line in send order (so nothing reaches Kafka out
of order), and the marks back in theirs, and retries with backoff (the queue fills, senders
feel backpressure); messages that expire while waiting fail with :class:`PersistError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from eoguard.config import ProducerConfig
from eoguard.errors import EoguardError, PersistError, StoreError
from eoguard.kafka.producer import KafkaProducer, Producible
from eoguard.modes import KeepUntil
from eoguard.producer.callbacks import CallbackDispatcher, Settled
from eoguard.producer.messages import Counters, MessageState, PendingMessage
from eoguard.producer.outbox_queue import LogQueue
from eoguard.store.outbox import Outbox, PutResult

__all__ = ["OutboxWriter", "StartedWrite"]

log = logging.getLogger(__name__)

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 1.0


class StartedWrite(NamedTuple):
    """A write handed to the Redis thread: what it carries, and its outcome to come."""

    batch: list[PendingMessage]
    marks: list[str]
    resent: list[tuple[str, KeepUntil]]
    outcome: Future[PutResult]


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
        self._redis = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eoguard-outbox")

    def close(self) -> None:
        """Stop the Redis thread once the writes started are done."""
        self._redis.shutdown(wait=True)

    def write(self, batch: list[PendingMessage], marks: list[str],
              resent: list[tuple[str, KeepUntil]]) -> None:
        """:meth:`start` one write and :meth:`finish` it."""
        self.finish([self.start(batch, marks, resent)])

    def start(self, batch: list[PendingMessage], marks: list[str],
              resent: list[tuple[str, KeepUntil]]) -> StartedWrite:
        """Hand a write to the Redis thread: mark acknowledged records published and write
        ``batch``, in one round trip. ``marks`` are this producer's own records (its
        ``keep_until``); ``resent`` are resends, each with its record's ``keep_until``."""
        try:
            outcome = self._redis.submit(self._write, batch, marks, resent)
        except RuntimeError:  # the Redis thread is gone (interpreter exit): write here
            outcome = Future()
            try:
                outcome.set_result(self._write(batch, marks, resent))
            except StoreError as exc:
                outcome.set_exception(exc)
        return StartedWrite(batch, marks, resent, outcome)

    def _write(self, batch: list[PendingMessage], marks: list[str],
               resent: list[tuple[str, KeepUntil]]) -> PutResult:
        """On the Redis thread: the round trip of one write (raises :class:`StoreError`)."""
        keep = self.config.keep_until
        if resent:
            marks = list(marks)
            other: dict[KeepUntil, list[str]] = {}
            for message_id, record_keep in resent:
                if record_keep is keep:
                    marks.append(message_id)
                else:
                    other.setdefault(record_keep, []).append(message_id)
            for record_keep, ids in other.items():  # resends of another producer's records
                self.outbox.mark_published(ids, keep_until=record_keep)
        return self.outbox.write(batch, owner=self.instance_id, keep_until=keep,
                                 resend_after_ms=self.config.resend_after_ms,
                                 published=marks)[0]

    def finish(self, started: Sequence[StartedWrite]) -> bool:
        """Finish the oldest started write: wait for it, then settle its batch.

        Step 1. Wait for the write. If it failed, wait for every later one too and put all
                their batches back in send order, and their marks back (retried later).
        Step 2. Guarantee each message (its on_guaranteed is queued now, before Kafka).
        Step 3. persist-first: line them up for librdkafka; delayed: free their memory.

        Returns False when the write failed (every write in ``started`` is then finished).
        """
        # Step 1.
        first = started[0]
        try:
            result = first.outcome.result()
        except StoreError as exc:
            self.store_failed(exc)
            for later in started:
                later.outcome.exception()  # wait: the later ones' outcome no longer matters
            self._put_back(started)
            return False
        self.store_ok()
        if first.marks or first.resent:
            with self.queue.lock:
                self.queue.marks_done_locked(len(first.marks) + len(first.resent))
        if first.batch:
            self._settle_written(first.batch, set(result.expired),
                                 {id(m) for m in result.existing_entries})
        return True

    def _settle_written(self, batch: list[PendingMessage], expired: set[str],
                        existing: set[int]) -> None:
        """Steps 2 and 3 of :meth:`finish`.

        ``existing`` holds the messages (by identity) whose record was there already. Unless
        it is from an earlier attempt of this very write, such a message is a send of a
        caller's id seen before (a repeat after the application's crash, or an earlier send
        of this batch): guaranteed by the record found, and persist-first does not publish it
        again (that record's owner, or recovery, does).
        """
        q, c = self.queue, self.counters
        settled: list[Settled] = []
        guaranteed = MessageState.GUARANTEED
        found = 0  # in the outbox already, not written by this call
        with q.lock:
            for m in batch:
                m.persisting = False
                if expired and m.id in expired:
                    c.expired += 1
                    self._fail_locked(m, PersistError(
                        f"message {m.id} expired before it could be persisted"), settled)
                    continue
                # Step 2.
                m.persisted = True
                if m.settle(guaranteed):
                    c.guaranteed += 1
                    if m.on_guaranteed is not None:
                        settled.append((m, None))
                # Step 3.
                if existing and id(m) in existing and not m.rewritten:
                    c.already_in_outbox += 1
                    found += 1
                    if not self.delayed:  # not published twice; delayed sent it already
                        q.release_locked(m)
                        continue
                if self.delayed:
                    q.release_locked(m)
                    if m.acked:  # acknowledged while the write was in flight
                        q.add_marks_locked([m.id])
                else:
                    q.to_produce.append(m)
            c.persisted += len(batch) - len(expired) - found
            if self.delayed or expired or existing:
                q.space.notify_all()
        self.dispatcher.submit(settled, wake=True)

    def _put_back(self, started: Sequence[StartedWrite]) -> None:
        """Failed writes: their batches back to the front of their line (in send order),
        their marks back to be retried (else recovery would resend those records)."""
        q, c = self.queue, self.counters
        settled: list[Settled] = []
        batch = [m for w in started for m in w.batch]
        with q.lock:
            q.publish_ids[:0] = [i for w in started for i in w.marks]
            q.resent_ids[:0] = [r for w in started for r in w.resent]
            q.marks_done_locked(sum(len(w.marks) + len(w.resent) for w in started))
            if batch:
                for m in batch:
                    m.rewritten = True
                    if m.acked:  # delayed: Kafka acknowledged it meanwhile, nothing to write
                        m.persisting = False
                        if q.release_locked(m):
                            c.redis_writes_avoided += 1
                q.put_back_locked([m for m in batch if not m.acked], delayed=self.delayed)
                self._fail_expired_locked(settled)
                q.space.notify_all()
        self.dispatcher.submit(settled)

    def produce_ready(self) -> bool:
        """persist-first: hand persisted messages to librdkafka while it takes them.

        Returns False when librdkafka's queue is full (Kafka slow or down): the rest waits,
        holding its room in the queue, while persisting goes on.
        """
        line = self.queue.to_produce
        taken = self.kafka.produce_each(line, self._refused)
        done = [line.popleft() for _ in range(taken)]
        with self.queue.lock:
            self.queue.release_all_locked(done)
            self.queue.space.notify_all()
        return not line

    @staticmethod
    def _refused(rec: Producible, error: EoguardError) -> None:
        log.error("Kafka refused %s at once; it stays pending in the outbox for recovery: %s",
                  getattr(rec, "id", "?"), error)

    def flush_publish_marks(self) -> None:
        """One last attempt to mark acknowledged records published (on close)."""
        with self.queue.lock:
            ids, resent = self.queue.take_marks_locked()
        if ids or resent:
            self.write([], ids, resent)

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
        if m.settle(MessageState.FAILED, error):
            self.counters.failed += 1
            settled.append((m, error))
        self.queue.release_locked(m)

    def _fail_expired_locked(self, settled: list[Settled]) -> None:
        """Messages that expired while waiting for the outbox: failed, room released."""
        now_ms = time.time_ns() // 1_000_000
        for line in (self.queue.to_persist, self.queue.log):
            keep = [m for m in line if m.expires_at_ms > now_ms or m.acked]
            for m in line:
                if m.expires_at_ms <= now_ms and not m.acked:
                    self.counters.expired += 1
                    self._fail_locked(m, PersistError(f"message {m.id} expired while "
                                                      "the outbox was unavailable"), settled)
            line.clear()
            line.extend(keep)
