"""Rewinds of the consumer's partitions that must take effect before anything is committed.

When Redis or Kafka fails mid-batch, the consumer seeks each partition back to the first
record it holds. A seek can fail (librdkafka refuses it while a partition's fetcher restarts);
the consumer position then stays past the uncommitted records, and committing what it reads
next would skip them for good. A :class:`Rewinds` keeps such a partition's floor: records read
past it are dropped and the seek retried until a record at or below the floor shows it took.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from confluent_kafka import Message

from eoguard.errors import BrokerError
from eoguard.kafka.consumer import KafkaConsumer, Partition

log = logging.getLogger(__name__)


class Rewinds:
    """Per partition, the offset the next record read must not be past (a pending rewind)."""

    def __init__(self, kafka: KafkaConsumer) -> None:
        self._kafka = kafka
        self._floors: dict[Partition, int] = {}

    def __bool__(self) -> bool:
        return bool(self._floors)

    def rewind(self, first: Mapping[Partition, int]) -> None:
        """Seek each partition back to ``first``; a failed seek leaves a floor."""
        for tp, offset in first.items():
            self._floors[tp] = min(self._floors.get(tp, offset), offset)
        self._seek()

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Partitions revoked or lost: their next reader starts from the committed offset."""
        for tp in partitions:
            self._floors.pop(tp, None)

    def admit(self, msgs: list[Message]) -> list[Message]:
        """The records not read past their partition's floor (seeking again if some were)."""
        if not self._floors:
            return msgs
        kept: list[Message] = []
        ahead = False
        for msg in msgs:
            tp = (msg.topic() or "", msg.partition() or 0)
            floor = self._floors.get(tp)
            if floor is not None and (msg.offset() or 0) > floor:
                ahead = True
                continue
            if floor is not None:  # at or below the floor: the rewind took
                del self._floors[tp]
            kept.append(msg)
        if ahead:
            self._seek()
        return kept

    def _seek(self) -> None:
        for tp, offset in list(self._floors.items()):
            try:
                self._kafka.seek({tp: offset})
            except BrokerError as exc:
                log.warning("rewind of %s[%d] to %d failed (retried): %s", *tp, offset, exc)
            else:
                del self._floors[tp]
