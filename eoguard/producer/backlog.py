"""What one producer holds in memory and still owes the outbox, under one lock.

A message holds room (one message, its bytes) from ``send`` until eoguard no longer needs it
in memory: persist-first gives it back once the message is in the outbox and handed to
librdkafka; delayed once Kafka acknowledged it or it was written to the outbox. When the
queue is full, ``send`` blocks up to ``send_timeout_s`` and then raises - never a silent
drop. Messages waiting for the outbox form one line, in send order.

:class:`Backlog` is the base of :class:`~eoguard.producer.ledger.Ledger`, which adds every
message's stage and the transitions that change it (and this bookkeeping with them): the
lock here is the ledger's, the one lock of the producer's message state.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable

from eoguard.errors import EoguardError, ProducerClosedError
from eoguard.modes import KeepUntil
from eoguard.producer.callbacks import CallbackDispatcher
from eoguard.producer.marks import PublishMarks
from eoguard.producer.messages import Counters, PendingMessage, Stage
from eoguard.producer.recovery import RecoveryReport

__all__ = ["Backlog"]

_ACKED, _FAILED = Stage.ACKED, Stage.FAILED


class Backlog:
    """Room, the line, the publish marks owed and the counters. Public methods take the
    lock; private ones run under it."""

    def __init__(self, *, delayed: bool, max_messages: int, max_bytes: int,
                 dispatcher: CallbackDispatcher) -> None:
        self.delayed = delayed
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._dispatcher = dispatcher  # settled messages' callbacks, after the lock is let go
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # wakes senders blocked on a full queue
        self._work = threading.Condition(self._lock)  # wakes the flusher
        self._work_arrived = False  # since the flusher last took: it must not sleep
        self._closed = False
        self.depth = 0  # messages holding room
        self.bytes = 0
        # Waiting for the outbox, in send order (delayed: with messages acknowledged or
        # failed while waiting, until the flusher passes them).
        self._line: collections.deque[PendingMessage] = collections.deque()
        self._marks = PublishMarks()
        self._counters = Counters()

    def _wait_for_room(self, size: int, timeout_s: float,
                       full_error: Callable[[], EoguardError]) -> None:
        """Block until ``size`` more bytes and one more message fit; ``full_error()`` after
        ``timeout_s``, ProducerClosedError once closed."""
        if self._closed:
            raise ProducerClosedError("send after close")
        deadline = time.monotonic() + timeout_s
        while self.depth >= self.max_messages or self.bytes + size > self.max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise full_error()
            self._space.wait(remaining)
            if self._closed:
                raise ProducerClosedError("the producer closed while send was blocked")

    def _release(self, msg: PendingMessage) -> None:
        """Give its room back and drop its value (in librdkafka, acknowledged, in the outbox
        or failed: no longer needed here)."""
        msg.value = b""
        self.depth -= 1
        self.bytes -= msg.size

    # The flusher's wake-ups ------------------------------------------------------------------
    def _wake_flusher(self) -> None:
        self._work_arrived = True
        self._work.notify()

    def _add_marks(self, own: list[str], resent: list[tuple[str, KeepUntil]]) -> None:
        if self._marks.add(own, resent):
            self._wake_flusher()

    def wake_times(self) -> tuple[float | None, float | None]:
        """When the waiting publish marks are due, and when the oldest waiting message was
        sent (monotonic; None when there is none): the flusher's wake-ups."""
        with self._lock:
            line = self._line
            while line and (line[0].stage is _ACKED or line[0].stage is _FAILED):
                line.popleft()
            return (self._marks.due_mono if self._marks.waiting else None,
                    line[0].created_mono if line else None)

    def wait_for_work(self, timeout_s: float) -> None:
        """Let the flusher sleep up to ``timeout_s``, unless work (a send to an empty line,
        the first publish marks, :meth:`wake`) arrived since it last took a write."""
        with self._lock:
            if not self._work_arrived:
                self._work.wait(timeout_s)

    def wake(self) -> None:
        """Wake the flusher (it is stopping)."""
        with self._lock:
            self._wake_flusher()

    # Marks and resends owed ------------------------------------------------------------
    def take_marks(self) -> tuple[list[str], list[tuple[str, KeepUntil]]]:
        """Every waiting publish mark (own, resent), for one last write on close."""
        with self._lock:
            return self._marks.take()

    def take_resend_ids(self) -> list[str]:
        """This producer's records whose delivery failed for want of a broker."""
        with self._lock:
            return self._marks.take_resend_ids()

    def keep_resend_ids(self, ids: list[str]) -> None:
        """Resends of :meth:`take_resend_ids` that could not run: first at the next pass."""
        with self._lock:
            self._marks.add_resend_ids(ids, first=True)

    # Closing and inspection ------------------------------------------------------------
    def close(self) -> None:
        """Refuse new sends; senders blocked on a full queue raise ProducerClosedError."""
        with self._lock:
            self._closed = True
            self._space.notify_all()

    def count_recovery(self, report: RecoveryReport) -> None:
        with self._lock:
            self._counters.resent += report.resent
            self._counters.expired += report.expired

    def outstanding(self) -> int:
        """Messages holding room, and publish marks not yet written."""
        with self._lock:
            return self.depth + self._marks.outstanding

    def backlog(self) -> tuple[int, int]:
        """Messages holding room, and their bytes."""
        with self._lock:
            return self.depth, self.bytes

    def snapshot(self) -> tuple[Counters, int, int]:
        """A copy of the counters, the messages holding room and their bytes, read at once."""
        with self._lock:
            return dataclasses.replace(self._counters), self.depth, self.bytes
