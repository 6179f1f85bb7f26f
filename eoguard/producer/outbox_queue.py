"""The producer's bounded in-memory queue: the log queue of the delayed mode, and backpressure.

A message holds room (one message, its bytes) from ``send`` until eoguard no longer needs it
in memory: persist-first releases it once it is in the outbox and handed to librdkafka;
delayed releases it once Kafka acknowledged it or it was written to the outbox. When the
queue is full, ``send`` blocks up to ``send_timeout_s`` and then raises - never a silent drop.

Everything here is guarded by ``lock``; ``space`` wakes blocked senders, ``work`` wakes the
flusher thread (batches to write, publish marks to send). Methods ending in ``_locked`` expect
the caller to hold ``lock``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from eoguard.errors import EoguardError, ProducerClosedError
from eoguard.modes import KeepUntil
from eoguard.producer.messages import MessageState, PendingMessage

__all__ = ["MARK_DELAY_S", "LogQueue"]

MARK_DELAY_S = 0.01
"""How long publish marks wait for an outbox write to ride along with before going alone."""


class LogQueue:
    """Room accounting plus the two waiting lines the flusher takes batches from."""

    def __init__(self, *, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)
        self.work = threading.Condition(self.lock)
        self.depth = 0  # messages holding room
        self.bytes = 0
        self.closed = False
        # persist-first: waiting for the outbox write (send order).
        self.to_persist: collections.deque[PendingMessage] = collections.deque()
        # persist-first: in the outbox, waiting for room in librdkafka's queue (Kafka slow).
        self.to_produce: collections.deque[PendingMessage] = collections.deque()
        # delayed: produced, waiting for Kafka's ack or the end of the delay (send order).
        self.log: collections.deque[PendingMessage] = collections.deque()
        # ids Kafka acknowledged whose outbox record must be marked published: this
        # producer's own records (its keep_until), and resent ones (each with the record's).
        self.publish_ids: list[str] = []
        self.resent_ids: list[tuple[str, KeepUntil]] = []
        # Marks wait up to MARK_DELAY_S for a batch to ride along with (one round trip).
        self.marks_due = 0.0  # monotonic time by which the waiting marks are written
        self.marks_in_flight = 0  # taken for a write not finished yet

    def reserve(self, msg: PendingMessage, timeout_s: float,
                full_error: Callable[[], EoguardError]) -> None:
        """Take room for ``msg``, blocking up to ``timeout_s``; raise ``full_error()`` then."""
        size = msg.size
        with self.lock:
            if self.closed:
                raise ProducerClosedError("send after close")
            if self.depth >= self.max_messages or self.bytes + size > self.max_bytes:
                deadline = time.monotonic() + timeout_s
                while self.depth >= self.max_messages or self.bytes + size > self.max_bytes:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise full_error()
                    self.space.wait(remaining)
                    if self.closed:
                        raise ProducerClosedError("the producer closed while send was blocked")
            self.depth += 1
            self.bytes += size

    def release_locked(self, msg: PendingMessage) -> bool:
        """Give ``msg``'s room back (once), and drop its value (no longer needed: it is in
        librdkafka, or acknowledged, or in the outbox); True if this call released it."""
        if msg.released:
            return False
        msg.released = True
        msg.value = b""
        self.depth -= 1
        self.bytes -= msg.size
        return True

    def release_all_locked(self, msgs: list[PendingMessage]) -> None:
        """:meth:`release_locked` each of ``msgs``."""
        for msg in msgs:
            if not msg.released:
                msg.released = True
                msg.value = b""
                self.depth -= 1
                self.bytes -= msg.size

    def take_to_persist_locked(self, limit: int) -> list[PendingMessage]:
        """persist-first: the next messages to write to the outbox, marked persisting."""
        batch: list[PendingMessage] = []
        line = self.to_persist
        while line and len(batch) < limit:
            msg = line.popleft()
            msg.persisting = True
            batch.append(msg)
        return batch

    def take_due_locked(self, cutoff_mono: float, limit: int) -> list[PendingMessage]:
        """delayed: unacknowledged messages sent at or before ``cutoff_mono``, marked persisting.

        Acknowledged or failed messages at the head are dropped from the line on the way
        (their room was released when they were acknowledged or failed).
        """
        batch: list[PendingMessage] = []
        line = self.log
        while line and len(batch) < limit:
            msg = line[0]
            if msg.acked or msg.state is MessageState.FAILED:
                line.popleft()
                continue
            if msg.created_mono > cutoff_mono:
                break
            line.popleft()
            msg.persisting = True
            batch.append(msg)
        return batch

    def head_sent_at_locked(self) -> float | None:
        """Monotonic send time of the oldest message still waiting in the log queue."""
        line = self.log
        while line and (line[0].acked or line[0].state is MessageState.FAILED):
            line.popleft()
        return line[0].created_mono if line else None

    def put_back_locked(self, batch: list[PendingMessage], *, delayed: bool) -> None:
        """A failed outbox write: return the batch to the front of its line, in order."""
        line = self.log if delayed else self.to_persist
        for msg in reversed(batch):
            msg.persisting = False
            line.appendleft(msg)

    def add_marks_locked(self, message_ids: list[str]) -> None:
        """Queue publish marks of this producer's own records."""
        if not self.publish_ids and not self.resent_ids:
            self.marks_due = time.monotonic() + MARK_DELAY_S
            self.work.notify()
        self.publish_ids += message_ids

    def add_resent_mark_locked(self, message_id: str, keep_until: KeepUntil) -> None:
        """Queue a publish mark of a resent record (with the record's own ``keep_until``)."""
        if not self.publish_ids and not self.resent_ids:
            self.marks_due = time.monotonic() + MARK_DELAY_S
            self.work.notify()
        self.resent_ids.append((message_id, keep_until))

    def take_marks_locked(self) -> tuple[list[str], list[tuple[str, KeepUntil]]]:
        """Every waiting publish mark (this producer's, and resent records'), now in flight
        until :meth:`marks_done_locked`."""
        marks, self.publish_ids = self.publish_ids, []
        resent, self.resent_ids = self.resent_ids, []
        self.marks_in_flight += len(marks) + len(resent)
        return marks, resent

    def marks_done_locked(self, marks: int) -> None:
        """A write carrying ``marks`` taken marks finished (or put them back)."""
        self.marks_in_flight -= marks

    @property
    def marks_waiting(self) -> int:
        """Acknowledged records whose publish mark is not yet taken for writing."""
        return len(self.publish_ids) + len(self.resent_ids)

    @property
    def marks_outstanding(self) -> int:
        """Acknowledged records whose publish mark is not yet written."""
        return len(self.publish_ids) + len(self.resent_ids) + self.marks_in_flight

    def waiting_locked(self) -> list[PendingMessage]:
        """Every message still in a line (for close: those never guaranteed fail)."""
        return [*self.to_persist, *self.log]
