"""Produce records and wait until Kafka has them (acks=all): dead letters and handler outputs.

The consumer calls :meth:`DeliverySink.flush` before it marks a batch done or commits past a
dead-lettered record, so nothing it depends on is still only in librdkafka's memory. Neither
call blocks for long while Kafka is down: both raise :class:`BrokerUnavailableError` after a
bound, and the consumer rewinds its batch instead of stalling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from eoguard.errors import BrokerError, BrokerUnavailableError, ConfigError
from eoguard.kafka.security import client_config


class DeliverySink:
    """A lazily created idempotent producer whose ``flush`` raises on any failed delivery.

    ``produce_timeout_s`` bounds how long :meth:`produce` waits for room in librdkafka's full
    local queue without a single delivery succeeding (Kafka down or unreachable); a queue that
    drains, however slowly, keeps it waiting.
    """

    def __init__(self, conf: Mapping[str, Any], *, produce_timeout_s: float = 10.0) -> None:
        if produce_timeout_s <= 0:
            raise ConfigError(f"produce_timeout_s must be > 0, got {produce_timeout_s}")
        self._conf, self._security = client_config(conf)
        self._producer: Producer | None = None
        self._failures: list[str] = []
        self.produce_timeout_s = produce_timeout_s
        self.pending = 0
        self._delivered = 0  # successful deliveries: progress while the queue is full

    def _client(self) -> Producer:
        if self._producer is None:
            try:
                self._producer = Producer(self._conf)
            except KafkaException as exc:
                raise BrokerError(f"creating the delivery producer: {exc}") from exc
        return self._producer

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None:
            self._failures.append(f"{msg.topic()}: {err}")
        else:
            self._delivered += 1

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: Sequence[tuple[str, bytes]] | None = None) -> None:
        """Queue one record; a full local queue is drained by serving delivery reports.

        Raises :class:`BrokerUnavailableError` when the queue stays full for
        ``produce_timeout_s`` with no record delivered meanwhile.
        """
        producer = self._client()
        deadline = 0.0
        delivered = self._delivered
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=list(headers or []),
                                 on_delivery=self._on_delivery)
                self.pending += 1
                return
            except BufferError as exc:
                now = time.monotonic()
                if not deadline or self._delivered != delivered:  # first wait, or progress
                    deadline, delivered = now + self.produce_timeout_s, self._delivered
                elif now >= deadline:
                    raise BrokerUnavailableError(
                        f"producing to {topic}: the local queue stayed full ({self.pending} "
                        f"record(s) pending) and Kafka took none for {self.produce_timeout_s} s"
                    ) from exc
                producer.poll(min(0.1, max(0.0, deadline - now)))
            except KafkaException as exc:
                raise BrokerError(f"producing to {topic}: {exc}") from exc

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued record; raise if one failed or Kafka did not answer in time."""
        if self._producer is None:
            return
        deadline = time.monotonic() + timeout_s
        while self.pending > 0 and time.monotonic() < deadline:
            self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        failures, self._failures = self._failures, []
        refused = self._security.take()
        if self.pending > 0:
            # The unanswered records stay queued in librdkafka; callers must not move past them.
            if refused is not None:
                raise refused
            raise BrokerUnavailableError(f"{self.pending} record(s) not acknowledged by Kafka "
                                         f"within {timeout_s} s")
        if failures:
            raise BrokerError(f"{len(failures)} record(s) failed: {'; '.join(failures[:3])}")

    def close(self, timeout_s: float = 10.0) -> None:
        if self._producer is not None:
            self._producer.flush(timeout_s)
            self._producer = None
