"""The flusher's outbox work: write batches, hand persisted messages to Kafka, mark published.

A batch and the publish marks gathered meanwhile go to Redis together, in one round trip and
one script call (so one AOF fsync). Writes run on one Redis thread, in the order started, so
the flusher can start the next write while one is in flight: Redis works on one batch while
the flusher settles and produces the one before. Writes are finished in the order started.

Redis outages are absorbed here: a failed write puts its batch, and the batches of every write
started after it, back at the front of the line in send order (so nothing reaches Kafka out
of order), and the marks back in theirs, and retries with backoff (the queue fills, senders
feel backpressure); messages that expire while waiting fail with :class:`PersistError`.
What each outcome does to a message is the ledger's (:mod:`~eoguard.producer.ledger`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from eoguard.backoff import jittered
from eoguard.config import ProducerConfig
from eoguard.errors import EoguardError, StoreError
from eoguard.kafka.producer import KafkaProducer, Producible
from eoguard.modes import KeepUntil
from eoguard.producer.ledger import Ledger
from eoguard.producer.messages import PendingMessage
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

    def __init__(self, *, config: ProducerConfig, instance_id: str, ledger: Ledger,
                 kafka: KafkaProducer, outbox: Outbox, redis_now_ms: Callable[[], int]) -> None:
        self.config = config
        self.redis_now_ms = redis_now_ms  # expiries are judged by Redis's clock (§5, Clocks)
        self.instance_id = instance_id
        self.ledger = ledger
        self.kafka = kafka
        self.outbox = outbox
        # persist-first: in the outbox, waiting for room in librdkafka's queue (Kafka slow).
        # The flusher's alone (it fills and drains it).
        self.to_produce: collections.deque[PendingMessage] = collections.deque()
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
        Step 2. Settle its messages in the ledger (on_guaranteed is queued now, before Kafka).
        Step 3. persist-first: line the stored ones up for librdkafka.

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
            self.ledger.write_failed([m for w in started for m in w.batch],
                                     [i for w in started for i in w.marks],
                                     [r for w in started for r in w.resent],
                                     now_ms=self.redis_now_ms())
            return False
        self.store_ok()
        # Step 2.
        stored = self.ledger.written(
            first.batch, marks_done=len(first.marks) + len(first.resent),
            expired=set(result.expired), existing={id(m) for m in result.existing_entries})
        # Step 3.
        if stored:
            self.to_produce.extend(stored)
        return True

    def produce_ready(self) -> bool:
        """persist-first: hand stored messages to librdkafka while it takes them.

        Returns False when librdkafka's queue is full (Kafka slow or down): the rest waits,
        holding its room in the queue, while persisting goes on.
        """
        line = self.to_produce
        taken = self.kafka.produce_each(line, self._refused)
        if taken:
            self.ledger.produced([line.popleft() for _ in range(taken)])
        return not line

    @staticmethod
    def _refused(rec: Producible, error: EoguardError) -> None:
        log.error("Kafka refused %s at once; it stays pending in the outbox for recovery: %s",
                  getattr(rec, "id", "?"), error)

    def flush_publish_marks(self) -> None:
        """One last attempt to mark acknowledged records published (on close)."""
        ids, resent = self.ledger.take_marks()
        if ids or resent:
            self.write([], ids, resent)

    def store_failed(self, exc: StoreError) -> None:
        if self.store_available:
            log.warning("the outbox is unavailable; retrying: %s", exc)
        self.store_available = False
        self._backoff_s = min(max(self._backoff_s * 2, _BACKOFF_MIN_S), _BACKOFF_MAX_S)
        self.retry_at = time.monotonic() + jittered(self._backoff_s)

    def store_ok(self) -> None:
        if not self.store_available:
            log.warning("the outbox is available again")
        self.store_available = True
        self._backoff_s = 0.0
        self.retry_at = 0.0
