"""The producer's background threads: the Kafka poll thread, the outbox flusher, maintenance.

Delivery reports are served by the sending thread every so many sends and, while it is not
sending, by the poll thread (:class:`Deliveries` settles them). The flusher runs the outbox
writes (:class:`OutboxWriter`) in send order, two in flight at most (Redis works on one
while the flusher settles the other): persist-first writes each batch and then hands it to
Kafka; delayed writes only what is still unacknowledged when the adaptive delay ends. The
publish marks of acknowledged records ride along with those writes (one round trip, one AOF
fsync); with no write to ride along with, they go alone after ``MARK_DELAY_S``. The
maintenance thread renews the liveness lease, updates the delay and runs recovery. No
thread here runs application callbacks: settled messages go to the
:class:`CallbackDispatcher` after the lock is released.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any

from eoguard.config import ProducerConfig
from eoguard.envelope import now_ms
from eoguard.errors import StoreError
from eoguard.kafka.producer import KafkaProducer
from eoguard.modes import KeepUntil, PersistenceMode
from eoguard.producer.delay import DelayInputs, DelayPolicy
from eoguard.producer.deliveries import Deliveries
from eoguard.producer.ledger import Ledger
from eoguard.producer.messages import PendingMessage
from eoguard.producer.recovery import Recovery
from eoguard.producer.writer import OutboxWriter, StartedWrite
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox

__all__ = ["ProducerEngine"]

log = logging.getLogger(__name__)

_DELAY_UPDATE_S = 0.1
_PRODUCE_RETRY_S = 0.005  # librdkafka's queue was full: try again this soon
# The poll thread stays off while a sending thread served the delivery reports this recently.
_SENDER_POLL_GRACE_S = 0.02
# Outbox writes in flight at once: Redis works on one while the flusher settles the other.
_MAX_WRITES_IN_FLIGHT = 2


class ProducerEngine:
    """Background work of one GuardedProducer; see the module docstring."""

    def __init__(self, *, config: ProducerConfig, instance_id: str, ledger: Ledger,
                 kafka: KafkaProducer, outbox: Outbox, liveness: Liveness, recovery: Recovery,
                 reports: collections.deque[tuple[Any, Any, Any]]) -> None:
        self.config = config
        self.instance_id = instance_id
        self.delayed = config.mode is PersistenceMode.DELAYED
        self.ledger = ledger
        self.kafka = kafka
        self.liveness = liveness
        self.recovery = recovery
        self.deliveries = Deliveries(ledger=ledger, reports=reports)
        self.writer = OutboxWriter(config=config, instance_id=instance_id, ledger=ledger,
                                   kafka=kafka, outbox=outbox, redis_now_ms=self.redis_now_ms)
        self.policy = DelayPolicy(min_ms=config.delay_min_ms, max_ms=config.delay_max_ms,
                                  max_messages=config.max_queue_messages,
                                  max_bytes=config.max_queue_bytes)
        self.delay_ms: float = float(config.delay_max_ms)
        self.live_producers = 0
        self.clock_ahead_ms = 0  # this host's clock's lead over Redis's (0 when behind)
        self.sender_served_at = 0.0  # monotonic time a sending thread last served reports
        self._kafka_blocked = False
        now = time.monotonic()
        self._next_heartbeat = now + config.lease_s / 3
        self._next_delay_update = now
        self._next_recovery = now + config.recover_interval_s
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll_loop, name="eoguard-poll", daemon=True),
            threading.Thread(target=self._flush_loop, name="eoguard-flush", daemon=True),
            threading.Thread(target=self._maintain_loop, name="eoguard-maintain", daemon=True),
        ]

    @property
    def store_available(self) -> bool:
        return self.writer.store_available

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float) -> None:
        """Stop the threads (the flusher finishes its current step and the writes it
        started)."""
        self._stopping.set()
        self.ledger.wake()
        for thread in self._threads:
            thread.join(timeout_s)

    # Delivery reports: served by the sending thread while it is busy, else the poll thread
    def serve_deliveries(self, timeout_s: float = 0.0) -> None:
        """Serve and settle the delivery reports librdkafka has (waiting up to ``timeout_s``
        for some), on the calling thread: the sender calls this every so many sends, and
        ``flush`` while it waits.

        confluent-kafka takes the GIL once per delivery callback: a poll thread competing
        with a busy sender for the GIL gets one callback per switch interval and slows the
        sender at each handoff. So while the sender serves them, the poll thread stays off.
        """
        self.kafka.poll(timeout_s)
        if self.deliveries.reports:
            self.deliveries.process()
        self.sender_served_at = time.monotonic()

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            idle_s = time.monotonic() - self.sender_served_at
            if idle_s < _SENDER_POLL_GRACE_S:
                self._stopping.wait(_SENDER_POLL_GRACE_S - idle_s)
                continue
            self.kafka.poll(0.05)
            if self.deliveries.reports:
                self.deliveries.process()

    # Flusher thread: outbox writes and publish marks, in send order -----------------
    def _flush_loop(self) -> None:
        ledger, writer = self.ledger, self.writer
        started: collections.deque[StartedWrite] = collections.deque()
        while True:
            # Settle the delivery reports already in (serving librdkafka's too unless the
            # sender does): in delayed mode, acknowledgements are settled before deciding
            # what is still unacknowledged.
            if time.monotonic() - self.sender_served_at >= _SENDER_POLL_GRACE_S:
                self.kafka.poll(0)
            if self.deliveries.reports:
                self.deliveries.process()
            stopping = self._stopping.is_set()
            batch, marks, resent = self._take_write(len(started), stopping)
            idle = not batch and not marks and not resent
            if idle and not started and not writer.to_produce:
                if stopping:
                    return
                ledger.wait_for_work(self._sleep_s())  # at once if work arrived since the take
            if not idle:
                started.append(writer.start(batch, marks, resent))
            # Finish the oldest write once the pipeline is full or nothing more is to start.
            if started and (idle or len(started) >= _MAX_WRITES_IN_FLIGHT):
                if writer.finish(started):
                    started.popleft()
                else:
                    started.clear()  # every one of them was put back
            if writer.to_produce:
                self._kafka_blocked = not writer.produce_ready()
                if self._kafka_blocked:
                    time.sleep(_PRODUCE_RETRY_S)  # the poll thread drains librdkafka's queue
            if (self._stopping.is_set() and not started
                    and (not writer.store_available or self._kafka_blocked)):
                return  # closing: what is in the outbox goes out through recovery

    def _take_write(self, in_flight: int, stopping: bool) -> tuple[
            list[PendingMessage], list[str], list[tuple[str, KeepUntil]]]:
        """The next write to start (nothing while the pipeline is full): a batch due for the
        outbox, and the publish marks if due; never while the store backs off."""
        if in_flight >= _MAX_WRITES_IN_FLIGHT:
            return [], [], []
        now = time.monotonic()
        return self.ledger.take_write(
            limit=self.config.batch_max_messages,
            cutoff_mono=now - self.delay_ms / 1000.0 if self.delayed else math.inf,
            backing_off=now < self.writer.retry_at and not stopping, closing=stopping)

    # Maintenance thread: lease, delay, recovery -----------------------------------------
    def _maintain_loop(self) -> None:
        while not self._stopping.wait(self._next_timer_s()):
            self._timers()

    def _next_timer_s(self) -> float:
        now = time.monotonic()
        wake = min(self._next_heartbeat, self._next_recovery,
                   self._next_delay_update if self.delayed else now + 1.0)
        return min(max(wake - now, 0.001), 1.0)

    def _sleep_s(self) -> float:
        """How long the idle flusher may sleep: until the store's retry, the waiting marks'
        due time (not before that retry), the next delay update or the end of the oldest
        waiting message's delay; at most a second."""
        now = time.monotonic()
        wake = self.writer.retry_at or now + 1.0
        marks_due, head_sent = self.ledger.wake_times()
        if marks_due is not None:
            wake = min(wake, max(marks_due, self.writer.retry_at))
        if self.delayed:
            wake = min(wake, self._next_delay_update)  # the delay may shrink
            if head_sent is not None:
                wake = min(wake, head_sent + self.delay_ms / 1000.0)
        return min(max(wake - now, 0.001), 1.0)

    # Timers --------------------------------------------------------------------------
    def _timers(self) -> None:
        now = time.monotonic()
        if now >= self._next_delay_update and self.delayed:
            self._next_delay_update = now + _DELAY_UPDATE_S
            self.update_delay()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.lease_s / 3
            self.heartbeat()
        if now >= self._next_recovery and self.writer.store_available:
            self._next_recovery = now + self.config.recover_interval_s
            if not self._kafka_blocked:  # resends would only queue behind the backlog
                self.run_recovery()

    def update_delay(self) -> None:
        p50, p99 = self.deliveries.latency.percentiles(50, 99)
        depth, size = self.ledger.backlog()
        self.delay_ms = self.policy.delay_ms(DelayInputs(
            ack_p50_ms=p50, ack_p99_ms=p99, live_producers=self.live_producers,
            backlog_messages=depth, backlog_bytes=size))

    def heartbeat(self) -> None:
        try:
            self.renew_lease()
        except StoreError as exc:
            self.writer.store_failed(exc)

    def renew_lease(self) -> None:
        """Renew the liveness lease (raises :class:`StoreError`); note the live count and
        ``clock_ahead_ms``, which ``send`` takes off its expiry bound (docs/design.md §5,
        Clocks). The local time is read before the call, so the lead is never overstated: a
        clock in step with Redis's measures 0."""
        sent_at = now_ms()
        beat = self.liveness.heartbeat(self.instance_id, int(self.config.lease_s * 1000))
        self.live_producers = beat.live_count
        ahead = max(0, sent_at - beat.now_ms)
        if ahead > self.config.input_limits.clock_skew_ms >= self.clock_ahead_ms:
            log.warning("this host's clock runs %d ms ahead of Redis's: expiries are clamped to "
                        "Redis's now + max_ttl (docs/design.md §5, Clocks)", ahead)
        self.clock_ahead_ms = ahead

    def redis_now_ms(self) -> int:
        """Redis's clock as this producer estimates it: its own, less the lead measured at the
        last lease renewal (the clock ``send`` stamps expiries by)."""
        return now_ms() - self.clock_ahead_ms

    def run_recovery(self) -> None:
        """Resend this producer's failed deliveries, then one recovery pass."""
        failed = self.ledger.take_resend_ids()
        try:
            if failed:
                report = self.recovery.resend_failed(failed)
                failed = []
                self.ledger.count_recovery(report)
            report = self.recovery.run()
        except StoreError as exc:
            if failed:
                self.ledger.keep_resend_ids(failed)  # retried at the next pass (within the cap)
            self.writer.store_failed(exc)
            return
        self.ledger.count_recovery(report)
