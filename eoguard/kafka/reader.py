"""Reading a range of a topic without a consumer group, as kcat does: assign, read to the end.

Partitions are read one after the other, lowest first, each from its start offset to the end
it had when its reading began (librdkafka's partition EOF): the output is in a stable order,
and a count limit takes the same records on every run. Offsets are never committed.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from eoguard.errors import BrokerError, BrokerUnavailableError, ConfigError
from eoguard.kafka.security import client_config
from eoguard.redaction import scrub


class Start(enum.Enum):
    """Where reading a partition starts, besides an absolute or end-relative offset."""

    BEGINNING = "beginning"
    END = "end"


@dataclass(frozen=True)
class Offset:
    """A start offset as kcat's ``-o`` takes it: beginning, end, ``N`` (absolute), ``-N``
    (N before the end)."""

    start: Start | None = Start.BEGINNING
    value: int = 0  # with start None: absolute when >= 0, from the end when < 0

    @classmethod
    def parse(cls, text: str) -> Offset:
        """``beginning``, ``end``, ``N`` or ``-N``; ConfigError otherwise."""
        word = text.strip().lower()
        if word in {s.value for s in Start}:
            return cls(Start(word))
        try:
            return cls(None, int(word))
        except ValueError:
            raise ConfigError(f"offset {text!r}: expected beginning, end, N or -N") from None

    def resolve(self, low: int, high: int) -> int:
        """The first offset to read in a partition holding ``low`` to ``high - 1``."""
        if self.start is Start.BEGINNING:
            return low
        if self.start is Start.END:
            return high
        if self.value < 0:
            return max(low, high + self.value)
        return min(max(low, self.value), high)


class TopicReader:
    """A group-less consumer that reads ranges of one topic (see the module docstring)."""

    def __init__(self, conf: Mapping[str, Any], *, timeout_s: float = 30.0) -> None:
        settings, self._security = client_config({
            **conf,
            # Never committed nor joined: the group id only satisfies the client.
            "group.id": conf.get("group.id") or f"eoguard-browse-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True,
        })
        self._secrets = dict(settings)
        self.timeout_s = timeout_s
        try:
            self._consumer = Consumer(settings)
        except KafkaException as exc:
            raise _wrap(exc, "creating a consumer", self._secrets) from exc
        except (ValueError, TypeError) as exc:  # confluent-kafka's own checks of the dict
            raise ConfigError(scrub(f"invalid Kafka client configuration: {exc}", self._secrets)
                              ) from exc

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions, ascending; BrokerError when the topic does not exist."""
        try:
            meta = self._consumer.list_topics(topic, timeout=self.timeout_s)
        except KafkaException as exc:
            self._raise_security()
            raise _wrap(exc, f"reading the metadata of {topic!r}", self._secrets) from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            reason = found.error if found is not None else "not in the metadata"
            raise BrokerError(f"topic {topic!r} cannot be read: {reason}")
        return sorted(found.partitions)

    def read(self, topic: str, partitions: Sequence[int], start: Offset,
             limit: int | None = None) -> Iterator[Message]:
        """The records from ``start`` to the end of each partition, at most ``limit`` in all."""
        left = limit
        for partition in partitions:
            if left is not None and left <= 0:
                return
            for message in self._read_partition(topic, partition, start, left):
                yield message
                if left is not None:
                    left -= 1

    def _read_partition(self, topic: str, partition: int, start: Offset, limit: int | None
                        ) -> Iterator[Message]:
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.timeout_s)
        except KafkaException as exc:
            self._raise_security()
            raise _wrap(exc, f"reading the offsets of {topic}[{partition}]", self._secrets) from exc
        first = start.resolve(low, high)
        if first >= high or limit == 0:
            return
        self._consumer.assign([TopicPartition(topic, partition, first)])
        deadline = time.monotonic() + self.timeout_s
        taken = 0
        try:
            while limit is None or taken < limit:
                if time.monotonic() > deadline:
                    self._raise_security()
                    raise BrokerUnavailableError(
                        f"reading {topic}[{partition}] from offset {first} did not reach its end "
                        f"({high}) within {self.timeout_s:g} s")
                message = self._consumer.poll(timeout=0.5)
                if message is None:
                    continue
                err = message.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    if err.fatal() or not err.retriable():
                        raise BrokerError(f"reading {topic}[{partition}] failed: {err}")
                    continue
                taken += 1
                deadline = time.monotonic() + self.timeout_s  # progress: a new window
                yield message
        finally:
            self._consumer.unassign()

    def _raise_security(self, wait_s: float = 1.0) -> None:
        """Raise the refused login or certificate librdkafka reported, if any. Its error
        callback runs only inside poll, and its event may trail the failed request that
        brought us here: poll for up to ``wait_s`` (a failure path only)."""
        deadline = time.monotonic() + wait_s
        self._consumer.poll(0)
        while not self._security.seen() and time.monotonic() < deadline:
            self._consumer.poll(0.1)
        refused = self._security.take()
        if refused is not None:
            raise refused

    def close(self) -> None:
        self._consumer.close()


def _wrap(exc: KafkaException, doing: str, conf: Mapping[str, Any]) -> BrokerError | ConfigError:
    err = exc.args[0] if exc.args else None
    text = scrub(str(err.str() if isinstance(err, KafkaError) else exc), conf)
    if isinstance(err, KafkaError) and err.code() == KafkaError._INVALID_ARG:
        return ConfigError(f"Kafka client configuration refused: {text}")
    if isinstance(err, KafkaError) and err.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                                                      KafkaError._ALL_BROKERS_DOWN):
        return BrokerUnavailableError(f"Kafka is unreachable while {doing}: {text}")
    return BrokerError(f"Kafka refused {doing}: {text}")


__all__ = ["Offset", "Start", "TopicReader"]
