"""Kafka delivery reports -> settled messages, publish marks and ack-latency samples.

librdkafka's delivery callbacks only append ``(token, err, msg)`` to a deque (they run
inside ``poll`` on whichever thread polled); :meth:`Deliveries.process` settles them in
one pass under the queue lock and hands the application callbacks to the dispatcher.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from eoguard.errors import EoguardError
from eoguard.kafka.producer import delivery_error, is_unavailable
from eoguard.producer.callbacks import CallbackDispatcher, Settled
from eoguard.producer.delay import LatencyWindow
from eoguard.producer.messages import Counters, MessageState, PendingMessage
from eoguard.producer.outbox_queue import LogQueue
from eoguard.producer.recovery import ResendToken

__all__ = ["Deliveries"]

log = logging.getLogger(__name__)

MAX_FAILED_IDS = 100_000  # failed deliveries remembered for a prompt resend


class Deliveries:
    """Settles delivery reports for one producer."""

    def __init__(self, *, delayed: bool, queue: LogQueue, counters: Counters,
                 dispatcher: CallbackDispatcher,
                 reports: collections.deque[tuple[Any, Any, Any]]) -> None:
        self.delayed = delayed
        self.queue = queue
        self.counters = counters
        self.dispatcher = dispatcher
        self.reports = reports
        self.latency = LatencyWindow()
        # Outbox records whose delivery Kafka reported failed for want of a broker: librdkafka
        # retries nothing after that report, so this producer may resend them at once (the
        # maintenance thread takes them) instead of waiting out resend_after. Under q.lock.
        self.failed_ids: list[str] = []  # at most MAX_FAILED_IDS (the rest: resend_after)

    def process(self) -> None:
        """Settle the reports collected so far (any thread; no application code runs here).

        An acknowledged message is guaranteed (if it was not yet) and its outbox record, if
        it has one, is queued to be marked published. In delayed mode a message acknowledged
        before its outbox write is released from memory: a Redis write avoided.
        """
        settled: list[Settled] = []
        failures: list[EoguardError] = []
        marks: list[str] = []
        q, c, reports, delayed = self.queue, self.counters, self.reports, self.delayed
        add_latency, mark, guaranteed = self.latency.add_s, marks.append, MessageState.GUARANTEED
        published = avoided = newly_guaranteed = 0
        with q.lock:
            while reports:
                token, err, kmsg = reports.popleft()
                if token.__class__ is ResendToken:
                    published += self._resent_locked(token, err, failures)
                    continue
                msg: PendingMessage = token
                if err is not None:
                    failures.append(self._failed_locked(msg, err, settled))
                    continue
                published += 1
                latency_s = kmsg.latency()
                if latency_s is not None:
                    add_latency(latency_s)
                msg.acked = True
                if not delayed or msg.persisted:
                    mark(msg.id)  # its outbox record exists
                elif not msg.persisting and q.release_locked(msg):
                    avoided += 1
                # (persisting: the writer queues the publish mark once its write succeeded)
                if msg.settle(guaranteed):
                    newly_guaranteed += 1
                    if msg.on_guaranteed is not None:
                        settled.append((msg, None))
            c.published += published
            c.redis_writes_avoided += avoided
            c.guaranteed += newly_guaranteed
            if marks:
                q.add_marks_locked(marks)
            if avoided or failures:
                q.space.notify_all()
        self.dispatcher.submit(settled, wake=newly_guaranteed > 0)
        if failures:
            log.warning("%d deliveries failed (first: %s); those in the outbox stay pending "
                        "until recovery resends them", len(failures), failures[0])

    def _resent_locked(self, token: ResendToken, err: Any, failures: list[EoguardError]) -> int:
        """A resend's report: queue its publish mark (1), or count the failure (0)."""
        if err is None:
            self.queue.add_resent_mark_locked(token.message_id, token.keep_until)
            return 1
        self.counters.delivery_failures += 1
        failures.append(delivery_error(err))
        if is_unavailable(err) and len(self.failed_ids) < MAX_FAILED_IDS:
            self.failed_ids.append(token.message_id)
        return 0

    def _failed_locked(self, msg: PendingMessage, err: Any,
                       settled: list[Settled]) -> EoguardError:
        self.counters.delivery_failures += 1
        error = delivery_error(err, topic=msg.topic)
        # A permanent refusal of a delayed message not yet persisted fails it: persisting it
        # would only resend it into the same refusal until it expires. Anything else stays
        # pending: delayed mode persists it when its delay ends, and a record in the outbox
        # is resent by recovery once due.
        if (self.delayed and not (msg.persisting or msg.persisted) and not is_unavailable(err)
                and msg.settle(MessageState.FAILED, error)):
            self.counters.failed += 1
            self.queue.release_locked(msg)
            settled.append((msg, error))
        elif msg.persisted and is_unavailable(err) and len(self.failed_ids) < MAX_FAILED_IDS:
            self.failed_ids.append(msg.id)
        return error
