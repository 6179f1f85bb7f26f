"""The producer's bounded in-memory queue: the log queue of the delayed mode, and backpressure.

A message holds room (one message, its bytes) from ``send`` until eoguard no longer needs it
in memory: persist-first releases it once it is in the outbox and handed to librdkafka;
delayed releases it once Kafka acknowledged it or it was written to the outbox. When the
queue is full, ``send`` blocks up to ``send_timeout_s`` and then raises - never a silent drop.

Everything here is guarded by ``lock``; ``space`` wakes blocked senders, ``work`` wakes the
flusher thread, ``marks`` wakes the maintenance thread (publish marks). Methods ending in
``_locked`` expect the caller to hold ``lock``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from eoguard.errors import EoguardError, ProducerClosedError
from eoguard.guard.messages import MessageState, PendingMessage

__all__ = ["LogQueue"]


class LogQueue:
    """Room accounting plus the two waiting lines the flusher takes batches from."""

    def __init__(self, *, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)
        self.work = threading.Condition(self.lock)
        self.marks = threading.Condition(self.lock)
        self.depth = 0  # messages holding room
        self.bytes = 0
        self.closed = False
        # persist-first: waiting for the outbox write (send order).
        self.to_persist: collections.deque[PendingMessage] = collections.deque()
        # persist-first: in the outbox, waiting for room in librdkafka's queue (Kafka slow).
        self.to_produce: collections.deque[PendingMessage] = collections.deque()
        # delayed: produced, waiting for Kafka's ack or the end of the delay (send order).
        self.log: collections.deque[PendingMessage] = collections.deque()
        # ids Kafka acknowledged whose outbox record must be marked published.
        self.publish_ids: list[str] = []

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
        """Give ``msg``'s room back (once); True if this call released it."""
        if msg.released:
            return False
        msg.released = True
        self.depth -= 1
        self.bytes -= msg.size
        return True

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
            if msg.acked or msg.handle.state is MessageState.FAILED:
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
        while line and (line[0].acked or line[0].handle.state is MessageState.FAILED):
            line.popleft()
        return line[0].created_mono if line else None

    def put_back_locked(self, batch: list[PendingMessage], *, delayed: bool) -> None:
        """A failed outbox write: return the batch to the front of its line, in order."""
        line = self.log if delayed else self.to_persist
        for msg in reversed(batch):
            msg.persisting = False
            line.appendleft(msg)

    def waiting_locked(self) -> list[PendingMessage]:
        """Every message still in a line (for close: those never guaranteed fail)."""
        return [*self.to_persist, *self.log]
