"""A thin typed wrapper over ``confluent_kafka.Consumer``: batches, offsets, rebalance hooks.

Errors from confluent-kafka are wrapped at this boundary (BrokerError, BrokerUnavailableError).
Partition EOF events are not errors and are dropped; other per-message errors that librdkafka
reports as non-fatal (a broker briefly down) are counted and skipped, since librdkafka retries
them itself. A fatal one (the consumer fenced) is a ConsumerFencedError: no retry can help.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from eoguard.errors import BrokerError, BrokerUnavailableError, ConsumerFencedError
from eoguard.kafka.security import client_config

log = logging.getLogger(__name__)

Partition = tuple[str, int]
RebalanceHook = Callable[[list[Partition]], None]

_UNAVAILABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT}


def _is_fatal(err: KafkaError) -> bool:
    """A fatal error leaves the client unusable. An error event reports it with the code
    ``_FATAL`` and ``fatal()`` False (the original error is librdkafka's fatal error)."""
    return bool(err.fatal()) or err.code() in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID)


def _wrap(exc: KafkaException, doing: str) -> BrokerError | ConsumerFencedError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and _is_fatal(err):
        return ConsumerFencedError(f"Kafka failed the consumer for good while {doing}: {err}")
    if isinstance(err, KafkaError) and err.code() in _UNAVAILABLE:
        return BrokerUnavailableError(f"Kafka is unreachable while {doing}: {err}")
    return BrokerError(f"Kafka refused {doing}: {err or exc}")


class KafkaConsumer:
    """One confluent-kafka consumer in a group; offsets are stored and committed explicitly."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        conf, self._security = client_config(conf)
        self._user_on_commit = conf.pop("on_commit", None)
        try:
            self._consumer = Consumer({**conf, "on_commit": self._on_commit})
        except KafkaException as exc:
            raise _wrap(exc, "creating a consumer") from exc
        self.transient_errors = 0
        self._commit_failed = False

    def _on_commit(self, err: KafkaError | None, parts: list[TopicPartition]) -> None:
        """Served inside ``consume``: an asynchronous commit's outcome (the user's hook too)."""
        failed = [tp for tp in parts if tp.error is not None]
        if (err is not None and err.code() != KafkaError._NO_OFFSET) or failed:
            self._commit_failed = True
            log.warning("asynchronous commit failed (committed again when idle): %s",
                        err if err is not None else failed[0].error)
        if self._user_on_commit is not None:
            self._user_on_commit(err, parts)

    def take_commit_failure(self) -> bool:
        """Whether an asynchronous commit failed since the last call (librdkafka does not
        retry one refused during a rebalance): commit again, or an idle partition lags."""
        failed, self._commit_failed = self._commit_failed, False
        return failed

    def subscribe(self, topics: Sequence[str], *, on_assign: RebalanceHook | None = None,
                  on_revoke: RebalanceHook | None = None,
                  on_lost: RebalanceHook | None = None) -> None:
        """Join the group for ``topics``; the hooks run inside ``consume`` on rebalance."""

        def hook(fn: RebalanceHook | None) -> Callable[[Consumer, list[TopicPartition]], None]:
            def call(_: Consumer, parts: list[TopicPartition]) -> None:
                if fn is not None:
                    fn([(tp.topic, tp.partition) for tp in parts])
            return call

        kwargs: dict[str, Any] = {"on_assign": hook(on_assign), "on_revoke": hook(on_revoke)}
        if on_lost is not None:
            kwargs["on_lost"] = hook(on_lost)
        try:
            self._consumer.subscribe(list(topics), **kwargs)
        except KafkaException as exc:
            raise _wrap(exc, f"subscribing to {list(topics)}") from exc

    def consume(self, max_messages: int, timeout_s: float) -> list[Message]:
        """Up to ``max_messages`` records within ``timeout_s``; error events are filtered out.

        Raises :class:`BrokerSecurityError` when no record came and Kafka refused the login
        or its certificate was not trusted meanwhile.
        """
        try:
            batch = self._consumer.consume(num_messages=max_messages, timeout=timeout_s)
        except KafkaException as exc:
            raise _wrap(exc, "consuming") from exc
        refused = self._security.take()
        if refused is not None and not batch:
            raise refused
        out: list[Message] = []
        for msg in batch:
            err = msg.error()
            if err is None:
                out.append(msg)
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif _is_fatal(err):
                raise ConsumerFencedError(f"fatal consumer error: {err}")
            else:
                self.transient_errors += 1
                log.warning("consumer error (librdkafka retries): %s", err)
        return out

    def store_offsets(self, next_offsets: Mapping[Partition, int]) -> None:
        """Store, per partition, the offset of the next record to read (last handled + 1)."""
        if not next_offsets:
            return
        parts = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
        try:
            self._consumer.store_offsets(offsets=parts)
        except KafkaException as exc:
            raise _wrap(exc, "storing offsets") from exc

    def commit(self, *, asynchronous: bool) -> None:
        """Commit the stored offsets; nothing stored since the last commit is not an error."""
        try:
            if asynchronous:
                self._consumer.commit(asynchronous=True)
                return
            for tp in self._consumer.commit(asynchronous=False):
                if tp.error is not None:
                    raise BrokerError(f"commit of {tp.topic}[{tp.partition}] failed: {tp.error}")
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._NO_OFFSET:
                return
            raise _wrap(exc, "committing offsets") from exc

    def seek(self, offsets: Mapping[Partition, int]) -> None:
        """Rewind partitions so the next ``consume`` returns these offsets again."""
        for (topic, partition), offset in offsets.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                raise _wrap(exc, f"seeking {topic}[{partition}] to {offset}") from exc

    def committed(self, partitions: Iterable[Partition], timeout_s: float = 10.0
                  ) -> dict[Partition, int]:
        """The group's committed offsets (negative: none committed yet)."""
        parts = [TopicPartition(t, p) for t, p in partitions]
        try:
            found = self._consumer.committed(parts, timeout=timeout_s)
        except KafkaException as exc:
            raise _wrap(exc, "reading committed offsets") from exc
        return {(tp.topic, tp.partition): tp.offset for tp in found}

    def assignment(self) -> list[Partition]:
        try:
            return [(tp.topic, tp.partition) for tp in self._consumer.assignment()]
        except KafkaException as exc:
            raise _wrap(exc, "reading the assignment") from exc

    def close(self) -> None:
        """Leave the group (runs the revoke hook) and free the client."""
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer: %s", exc)
