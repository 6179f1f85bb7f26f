"""A thin typed wrapper over ``confluent_kafka.Producer``: errors become eoguard errors.

Delivery callbacks keep librdkafka's ``(err, msg)`` signature (they run inside :meth:`poll`
on the polling thread); :func:`delivery_error` turns ``err`` into a :class:`BrokerError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from eoguard.errors import (
    BrokerError,
    BrokerUnavailableError,
    ConfigError,
    EoguardError,
    MessageTooLargeError,
)
from eoguard.kafka.security import client_config

__all__ = ["DeliveryCallback", "KafkaProducer", "Producible", "delivery_error", "is_unavailable"]

DeliveryCallback = Callable[[Any, Any], None]
"""``(err: KafkaError | None, msg: confluent_kafka.Message) -> None``"""

# Kafka could not take the record from this producer: unreachable, out of sync, or the
# record was purged from librdkafka's queue at close. Not a refusal of the record itself.
_UNAVAILABLE = frozenset({
    KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT,
    KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE, KafkaError._RESOLVE,
    KafkaError.NETWORK_EXCEPTION, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
})
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


class Producible(Protocol):
    """A record :meth:`KafkaProducer.produce_each` hands over, with its delivery callback."""

    @property
    def topic(self) -> str: ...
    @property
    def value(self) -> bytes: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def headers(self) -> Mapping[str, str] | None: ...
    def delivered(self, err: Any, msg: Any) -> None: ...


def is_unavailable(err: Any) -> bool:
    """True when a delivery failed because Kafka could not take it now (not a refusal)."""
    return bool(err.code() in _UNAVAILABLE or err.retriable())


def delivery_error(err: Any, *, topic: str | None = None) -> BrokerError:
    """The eoguard error for a librdkafka ``KafkaError``."""
    where = f" (topic {topic})" if topic else ""
    if err.code() in _TOO_LARGE:
        return BrokerError(f"Kafka refused the record as too large{where}: {err.str()}")
    if is_unavailable(err):
        return BrokerUnavailableError(f"Kafka is unavailable{where}: {err.str()}")
    return BrokerError(f"Kafka refused the record{where}: {err.str()}")


def _refusal(exc: KafkaException, topic: str, value: bytes,
             key: bytes | None) -> BrokerError | MessageTooLargeError:
    """The eoguard error for librdkafka refusing a record at ``produce``."""
    err = exc.args[0]
    if err.code() in _TOO_LARGE:
        size = len(value) + len(key or b"")
        return MessageTooLargeError(f"librdkafka refused a {size}-byte record: {err.str()}",
                                    size=size, limit=-1)
    return delivery_error(err, topic=topic)


class KafkaProducer:
    """One librdkafka producer; thread-safe like the client it wraps."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        conf, self._security = client_config(conf)
        try:
            self._producer = confluent_kafka.Producer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"librdkafka refused the producer configuration: {exc}") from exc

    def produce(self, topic: str, value: bytes, key: bytes | None = None, *,
                headers: Mapping[str, str] | None = None,
                on_delivery: DeliveryCallback | None = None) -> bool:
        """Hand one record to librdkafka; False when its local queue is full (poll, retry).

        Raises :class:`MessageTooLargeError` when librdkafka refuses the size and
        :class:`BrokerError` for any other immediate refusal.
        """
        return self._hand(topic, value, key, list(headers.items()) if headers else None,
                          on_delivery)

    def produce_pairs(self, topic: str, value: bytes, key: bytes | None,
                      headers: Sequence[tuple[str, bytes]], *, on_delivery: DeliveryCallback,
                      partition: int = -1) -> bool:
        """:meth:`produce` with the headers as Kafka has them, pairs in order (a name may
        repeat), to ``partition`` (-1: the partitioner's choice): a record sent again with its
        headers exactly as they were."""
        return self._hand(topic, value, key, list(headers), on_delivery, partition)

    def _hand(self, topic: str, value: bytes, key: bytes | None,  # noqa: PLR0917
              headers: list[tuple[str, Any]] | None, on_delivery: DeliveryCallback | None,
              partition: int = -1) -> bool:
        """The one call into librdkafka's produce, and what its refusals mean."""
        try:
            if headers:
                self._producer.produce(topic, value, key, partition=partition,
                                       on_delivery=on_delivery, headers=headers)
            else:
                self._producer.produce(topic, value, key, partition=partition,
                                       on_delivery=on_delivery)
        except BufferError:
            return False
        except KafkaException as exc:
            raise _refusal(exc, topic, value, key) from exc
        return True

    def produce_each(self, records: Iterable[Producible],
                     on_refused: Callable[[Producible, EoguardError], None]) -> int:
        """:meth:`produce` each record in order (with its headers, if any; its ``delivered``
        is the delivery callback) until librdkafka's queue is full; returns how many it took.
        A record Kafka refuses at once counts as taken and goes to ``on_refused`` with the
        error."""
        produce = self._producer.produce
        taken = 0
        for rec in records:
            try:
                headers = rec.headers
                if headers:
                    produce(rec.topic, rec.value, rec.key, on_delivery=rec.delivered,
                            headers=list(headers.items()))
                else:
                    produce(rec.topic, rec.value, rec.key, on_delivery=rec.delivered)
            except BufferError:
                return taken
            except KafkaException as exc:
                on_refused(rec, _refusal(exc, rec.topic, rec.value, rec.key))
            taken += 1
        return taken

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery callbacks for up to ``timeout_s``; returns how many ran."""
        return int(self._producer.poll(timeout_s))

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries (callbacks run here); returns how many remain."""
        return int(self._producer.flush(timeout_s))

    def refused(self) -> BrokerError | None:
        """The refused login or untrusted certificate librdkafka reported since the last
        call (:class:`BrokerSecurityError`), or None."""
        return self._security.take()

    def refusing(self) -> bool:
        """Whether :meth:`refused` has an error to return."""
        return self._security.seen()

    def __len__(self) -> int:
        """Records handed over and not yet delivered or failed."""
        return len(self._producer)

    def close(self, timeout_s: float = 0.0) -> int:
        """Flush for up to ``timeout_s``, then drop what remains; returns what was dropped."""
        left = self.flush(timeout_s) if timeout_s > 0 else len(self)
        if left:
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.poll(0)
        return left
