"""The ledger: each in-memory message's stage, and all that changes with it, under one lock.

One lock guards every message's :class:`Stage` and handle state and the bookkeeping of
:class:`~eoguard.producer.backlog.Backlog`, which the ledger extends. Each transition is one
method taking the lock, so any thread may call it; :mod:`~eoguard.producer.deliveries` and
:mod:`~eoguard.producer.writer` only translate Kafka's and Redis's outcomes into these calls.
Callbacks of the messages a call settled go to the dispatcher once the lock is released.

Every legal combination of what the producer knows of a message, and the events that lead
to it from which stages. x yes, . no, ? maybe, - no longer read. prod: handed to librdkafka
(STORED: maybe already, its delivery report served on another thread first); ackd:
Kafka acknowledged it; wrtg: an outbox write of it is in flight; strd: a record of its id is
in the outbox; room: it holds room in the queue; rewr: written again after a failed write
(which may have landed); handle: its ``SendHandle.state``. Blocks: both modes, persist-first,
delayed, both::

    stage           prod ackd wrtg strd room rewr handle      reached by  event: from
    NEW             .    .    .    .    .    .    accepted    -

    QUEUED          .    .    .    .    x    .    accepted    send: NEW
    WRITING         .    .    x    .    x    .    accepted    take: QUEUED
    REQUEUED        .    .    .    .    x    x    accepted    write_failed: WRITING, REWRITING
    REWRITING       .    .    x    .    x    x    accepted    take: REQUEUED
    STORED          ?    .    .    x    x    -    guaranteed  written: WRITING, REWRITING
                                                              found: REWRITING
    ACKED_STORED    x    x    .    x    x    -    guaranteed  acked: STORED
    PRODUCED        x    .    .    x    .    -    guaranteed  produced: STORED
    FOUND           .    .    .    x    .    -    guaranteed  found: WRITING

    SENT            x    .    .    .    x    .    accepted    send: NEW
    SENT_WRITING    x    .    x    .    x    .    accepted    take: SENT
    SENT_REQUEUED   x    .    .    .    x    x    accepted    write_failed: SENT_WRITING, SENT_REWRITING
    SENT_REWRITING  x    .    x    .    x    x    accepted    take: SENT_REQUEUED
    ACKED_WRITING   x    x    x    .    x    .    guaranteed  acked: SENT_WRITING
    ACKED_REWRITING x    x    x    .    x    x    guaranteed  acked: SENT_REWRITING
    PERSISTED       x    .    .    x    .    -    guaranteed  written, found: SENT_WRITING, SENT_REWRITING
    ACKED           x    x    .    .    .    -    guaranteed  acked: SENT, SENT_REQUEUED
                                                              expired, write_failed: ACKED_WRITING,
                                                                ACKED_REWRITING
    WITHDRAWN       .    .    .    .    .    -    accepted    withdraw: SENT

    PUBLISHED       x    x    .    x    .    -    guaranteed  acked: PRODUCED, PERSISTED
                                                              produced: ACKED_STORED
                                                              written, found: ACKED_WRITING,
                                                                ACKED_REWRITING
    FAILED          -    .    .    .    .    -    failed      expired: WRITING, REWRITING, SENT_WRITING,
                                                                SENT_REWRITING
                                                              expire, close: QUEUED, REQUEUED, SENT,
                                                                SENT_REQUEUED
                                                              refused: SENT, SENT_REQUEUED

Events after which the stage stays as it is (recovery resends the record; delayed writes the
message when its delay ends; a message settled while in the delayed line is dropped from it);
any other raises :class:`~eoguard.producer.messages.StageError`. A record found after a failed
write may be that write's own (found from REWRITING is written)::

    refused, unavailable: STORED, PRODUCED, PERSISTED, SENT_WRITING, SENT_REWRITING
    unavailable: SENT, SENT_REQUEUED
    take, expire, close: ACKED, FAILED

Each event is the ledger method of its name, but: withdraw is within send; take is
take_write; found and expired are outcomes of written; expire is expire_waiting, close
fail_waiting; refused and unavailable are delivery_failed's (for good, for want of a broker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from eoguard.errors import EoguardError, PersistError, ProducerClosedError
from eoguard.modes import KeepUntil
from eoguard.producer.backlog import Backlog
from eoguard.producer.callbacks import Settled
from eoguard.producer.messages import MessageState, PendingMessage, Stage, StageError

__all__ = ["Ledger"]

# Stage members as module names: an Enum class attribute costs ~0.2 us on Python 3.11, and the
# transitions run once per message (a unit test pins each name to its member).
(_NEW, _QUEUED, _WRITING, _REQUEUED, _REWRITING, _STORED, _ACKED_STORED, _PRODUCED, _FOUND,
 _SENT, _SENT_WRITING, _SENT_REQUEUED, _SENT_REWRITING, _ACKED_WRITING, _ACKED_REWRITING,
 _PERSISTED, _ACKED, _WITHDRAWN, _PUBLISHED, _FAILED) = tuple(Stage)
_ACCEPTED, _GUARANTEED, _FAILED_STATE = tuple(MessageState)
_WAITING = (_QUEUED, _REQUEUED, _SENT, _SENT_REQUEUED)  # the line's unsettled stages
# Off the hot path, after a failed write (a dict keyed by an Enum hashes in Python: ~0.2 us).
_WRITE_AGAIN = {_WRITING: _REQUEUED, _REWRITING: _REQUEUED,
                _SENT_WRITING: _SENT_REQUEUED, _SENT_REWRITING: _SENT_REQUEUED}
_REWRITE = {_REQUEUED: _REWRITING, _SENT_REQUEUED: _SENT_REWRITING}


class Ledger(Backlog):
    """One producer's messages in memory: the transitions of the module docstring."""

    # The sender ----------------------------------------------------------------------------
    def send(self, msg: PendingMessage, timeout_s: float,
             full_error: Callable[[], EoguardError],
             produce: Callable[[PendingMessage], None]) -> None:
        """Take room for ``msg`` (blocking up to ``timeout_s``, then raising ``full_error()``)
        and line it up for the outbox. persist-first: NEW -> QUEUED. delayed: NEW -> SENT,
        then ``produce`` (on this thread, without the lock; its ack may be settled before
        the message is lined up), or -> WITHDRAWN if that raises (re-raised)."""
        if msg.stage is not _NEW:
            raise StageError(msg, "send")
        size = msg.size
        with self._lock:
            if self._closed or self.depth >= self.max_messages or \
                    self.bytes + size > self.max_bytes:
                self._wait_for_room(size, timeout_s, full_error)
            self.depth += 1
            self.bytes += size
            if not self.delayed:
                msg.stage = _QUEUED
                self._counters.sent += 1
                if not self._line:
                    self._wake_flusher()
                self._line.append(msg)
                return
            msg.stage = _SENT
        try:
            produce(msg)
        except EoguardError:
            self.withdraw(msg)
            raise
        with self._lock:
            self._counters.sent += 1
            if not self._line:
                self._wake_flusher()  # the end of its delay is the flusher's next wake
            self._line.append(msg)

    def withdraw(self, msg: PendingMessage) -> None:
        """librdkafka refused a delayed message at send: its room back. SENT -> WITHDRAWN."""
        with self._lock:
            if msg.stage is not _SENT:
                raise StageError(msg, "withdraw")
            msg.stage = _WITHDRAWN
            self._release(msg)
            self._space.notify_all()

    # The flusher ---------------------------------------------------------------------------
    def take_write(self, *, limit: int, cutoff_mono: float, backing_off: bool,
                   closing: bool) -> tuple[list[PendingMessage], list[str],
                                           list[tuple[str, KeepUntil]]]:
        """The next outbox write (take): up to ``limit`` waiting messages sent at or before
        ``cutoff_mono``, and the publish marks (own, resent) if due: with a batch, or alone
        once they waited MARK_DELAY_S or fill a batch, or when ``closing``; nothing while the
        store is ``backing_off``."""
        with self._lock:
            self._work_arrived = False
            if backing_off:
                return [], [], []
            batch = self._take(limit, cutoff_mono)
            marks = self._marks
            if marks.waiting and (batch or closing or marks.waiting >= limit
                                  or time.monotonic() >= marks.due_mono):
                return (batch, *marks.take())
            return batch, [], []

    def _take(self, limit: int, cutoff_mono: float) -> list[PendingMessage]:
        batch: list[PendingMessage] = []
        line = self._line
        while line and len(batch) < limit:
            msg = line[0]
            stage = msg.stage
            if stage is _ACKED or stage is _FAILED:
                line.popleft()  # settled while it waited
                continue
            if msg.created_mono > cutoff_mono:
                break
            if stage is _QUEUED:
                msg.stage = _WRITING
            elif stage is _SENT:
                msg.stage = _SENT_WRITING
            else:  # after a failed write (rare), or a bug
                again = _REWRITE.get(stage)
                if again is None:
                    raise StageError(msg, "take")
                msg.stage = again
            line.popleft()
            batch.append(msg)
        return batch

    def written(self, batch: Sequence[PendingMessage], *, marks_done: int, expired: set[str],
                existing: set[int]) -> list[PendingMessage]:
        """A write succeeded, with ``marks_done`` publish marks: per message its record was
        written, found there already (``existing``, by identity: a caller's id sent before)
        or found expired (``expired`` ids). Each is guaranteed unless it expired first;
        returns the persist-first messages now STORED, to hand to librdkafka."""
        settled: list[Settled] = []
        stored: list[PendingMessage] = []
        marks: list[str] = []  # acknowledged while their write was in flight
        guaranteed = persisted = found = 0
        with self._lock:
            self._marks.done(marks_done)
            for m in batch:
                stage = m.stage
                if expired and m.id in expired:
                    self._expired_at_write(m, settled)
                    continue
                was_found = bool(existing) and id(m) in existing and (
                    stage is _WRITING or stage is _SENT_WRITING or stage is _ACKED_WRITING)
                if stage is _WRITING or stage is _REWRITING:
                    if was_found:  # not published twice: its record's owner, or recovery, does
                        m.stage = _FOUND
                        self._release(m)
                    else:
                        m.stage = _STORED
                        stored.append(m)
                elif stage is _SENT_WRITING or stage is _SENT_REWRITING:
                    m.stage = _PERSISTED
                    self._release(m)
                elif stage is _ACKED_WRITING or stage is _ACKED_REWRITING:
                    m.stage = _PUBLISHED
                    self._release(m)
                    marks.append(m.id)
                else:
                    raise StageError(m, "found" if id(m) in existing else "written")
                found += was_found
                persisted += not was_found
                if m.state is _ACCEPTED:
                    m.state = _GUARANTEED
                    guaranteed += 1
                    if m.on_guaranteed is not None:
                        settled.append((m, None))
            c = self._counters
            c.guaranteed += guaranteed
            c.persisted += persisted
            c.already_in_outbox += found
            if marks:
                self._add_marks(marks, [])
            if len(stored) < len(batch):  # some gave their room back
                self._space.notify_all()
        self._dispatcher.submit(settled, wake=guaranteed > 0)
        return stored

    def _expired_at_write(self, m: PendingMessage, settled: list[Settled]) -> None:
        stage = m.stage
        if stage is _ACKED_WRITING or stage is _ACKED_REWRITING:
            m.stage = _ACKED  # guaranteed by its ack already
            self._release(m)
        elif stage in (_WRITING, _REWRITING, _SENT_WRITING, _SENT_REWRITING):
            self._fail(m, PersistError(f"message {m.id} expired before it could be persisted"),
                       settled)
        else:
            raise StageError(m, "expired")
        self._counters.expired += 1

    def write_failed(self, batch: Sequence[PendingMessage], marks: list[str],
                     resent: list[tuple[str, KeepUntil]], *, now_ms: int) -> None:
        """Writes failed (they may have landed): their marks wait again, first, and ``batch``
        goes back to the front of the line in send order, but for messages acknowledged
        meanwhile (a Redis write avoided); then :meth:`expire_waiting` at ``now_ms``."""
        back: list[PendingMessage] = []
        with self._lock:
            self._marks.put_back(marks, resent)
            for m in batch:
                if m.stage is _ACKED_WRITING or m.stage is _ACKED_REWRITING:
                    m.stage = _ACKED
                    self._release(m)
                    self._counters.redis_writes_avoided += 1
                    continue
                again = _WRITE_AGAIN.get(m.stage)
                if again is None:
                    raise StageError(m, "write_failed")
                m.stage = again
                back.append(m)
            self._line.extendleft(reversed(back))
        if batch:
            self.expire_waiting(now_ms)

    def expire_waiting(self, now_ms: int) -> None:
        """expire: fail the waiting messages past their expiry at ``now_ms`` (PersistError):
        Redis's time as the producer estimates it, the clock its expiries were stamped by."""
        self._fail_line("expire", now_ms)

    def fail_waiting(self) -> None:
        """close: fail every message still waiting for the outbox (ProducerClosedError)."""
        self._fail_line("close", None)

    def _fail_line(self, event: str, expired_at_ms: int | None) -> None:
        settled: list[Settled] = []
        with self._lock:
            keep: list[PendingMessage] = []
            for m in self._line:
                if m.stage is _ACKED or m.stage is _FAILED:
                    continue  # settled while it waited: dropped from the line
                if m.stage not in _WAITING:
                    raise StageError(m, event)
                if expired_at_ms is None:
                    self._fail(m, ProducerClosedError(
                        f"message {m.id} was neither persisted nor acknowledged before close"),
                        settled)
                elif m.expires_at_ms <= expired_at_ms:
                    self._counters.expired += 1
                    self._fail(m, PersistError(
                        f"message {m.id} expired while the outbox was unavailable"), settled)
                else:
                    keep.append(m)
            self._line.clear()
            self._line.extend(keep)
            self._space.notify_all()
        self._dispatcher.submit(settled)

    def _fail(self, m: PendingMessage, error: EoguardError, settled: list[Settled]) -> None:
        """Settle ``m`` FAILED (its on_failed queued) and give its room back."""
        m.stage = _FAILED
        m.state = _FAILED_STATE
        m.error = error
        self._counters.failed += 1
        self._release(m)
        settled.append((m, error))

    def produced(self, msgs: Sequence[PendingMessage]) -> None:
        """persist-first: librdkafka took these (or refused them at once: their records stay
        pending for recovery); their room back."""
        freed_bytes = 0
        with self._lock:
            for m in msgs:
                if m.stage is _STORED:
                    m.stage = _PRODUCED
                elif m.stage is _ACKED_STORED:
                    m.stage = _PUBLISHED
                else:
                    raise StageError(m, "produced")
                m.value = b""
                freed_bytes += m.size
            self.depth -= len(msgs)
            self.bytes -= freed_bytes
            self._space.notify_all()

    # Kafka's delivery reports ------------------------------------------------------------------
    def acked(self, msgs: Sequence[PendingMessage], resent: list[tuple[str, KeepUntil]]) -> None:
        """Kafka acknowledged ``msgs`` and the ``resent`` records (id, their keep_until): each
        message is guaranteed; a record in the outbox is queued to be marked published (one
        being written, once it lands); a delayed message not written is a write avoided."""
        settled: list[Settled] = []
        marks: list[str] = []
        guaranteed = avoided = freed_bytes = 0
        with self._lock:
            for m in msgs:
                stage = m.stage
                if stage is _PRODUCED or stage is _PERSISTED:
                    m.stage = _PUBLISHED
                    marks.append(m.id)
                    continue  # guaranteed when written
                if stage is _STORED:  # its report came before the flusher saw produce return
                    m.stage = _ACKED_STORED
                    marks.append(m.id)
                    continue
                if stage is _SENT or stage is _SENT_REQUEUED:
                    m.stage = _ACKED
                    m.value = b""
                    avoided += 1
                    freed_bytes += m.size
                elif stage is _SENT_WRITING:
                    m.stage = _ACKED_WRITING
                elif stage is _SENT_REWRITING:
                    m.stage = _ACKED_REWRITING
                else:
                    raise StageError(m, "acked")
                m.state = _GUARANTEED
                guaranteed += 1
                if m.on_guaranteed is not None:
                    settled.append((m, None))
            c = self._counters
            c.published += len(msgs) + len(resent)
            c.guaranteed += guaranteed
            c.redis_writes_avoided += avoided
            if marks or resent:
                self._add_marks(marks, resent)
            if avoided:
                self.depth -= avoided
                self.bytes -= freed_bytes
                self._space.notify_all()
        self._dispatcher.submit(settled, wake=guaranteed > 0)

    def delivery_failed(self, msgs: Sequence[tuple[PendingMessage, EoguardError, bool]],
                        resends: Sequence[tuple[str, bool]]) -> None:
        """Kafka failed deliveries (message, error, for want of a broker?; resent id, the same).
        A delayed message refused before any write fails (a write would only resend it into
        the refusal); a record in the outbox is resent at the next recovery pass when a broker
        was wanting (librdkafka retries nothing after that report), else once due."""
        settled: list[Settled] = []
        prompt = [message_id for message_id, unavailable in resends if unavailable]
        with self._lock:
            self._counters.delivery_failures += len(msgs) + len(resends)
            for m, error, unavailable in msgs:
                stage = m.stage
                if stage is _PRODUCED or stage is _PERSISTED or stage is _STORED:
                    if unavailable:
                        prompt.append(m.id)
                elif stage is _SENT or stage is _SENT_REQUEUED:
                    if not unavailable:
                        self._fail(m, error, settled)
                elif stage is not _SENT_WRITING and stage is not _SENT_REWRITING:
                    raise StageError(m, "unavailable" if unavailable else "refused")
            if prompt:
                self._marks.add_resend_ids(prompt)
            if settled:
                self._space.notify_all()
        self._dispatcher.submit(settled)
