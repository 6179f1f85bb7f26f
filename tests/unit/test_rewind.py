"""Rewinds: a failed seek never lets records past the rewind point through (pure logic)."""

from __future__ import annotations

from typing import Any

from eoguard.consumer.rewind import Rewinds
from eoguard.errors import BrokerError


class Record:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class Kafka:
    """A consumer whose seek fails ``failures`` times, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.seeks: list[dict[Any, int]] = []

    def seek(self, offsets: dict[Any, int]) -> None:
        self.seeks.append(dict(offsets))
        if self.failures:
            self.failures -= 1
            raise BrokerError("Local: Erroneous state")


def offsets(msgs: list[Any]) -> list[tuple[int, int]]:
    return [(m.partition(), m.offset()) for m in msgs]


def test_a_seek_that_works_leaves_no_floor() -> None:
    kafka = Kafka(failures=0)
    rewinds = Rewinds(kafka)  # type: ignore[arg-type]
    rewinds.rewind({("t", 0): 5})
    assert not rewinds
    assert kafka.seeks == [{("t", 0): 5}]
    msgs = [Record(0, 9)]
    assert rewinds.admit(msgs) == msgs  # nothing filtered once the seek took


def test_records_past_a_failed_rewind_are_dropped_until_the_seek_takes() -> None:
    kafka = Kafka(failures=2)
    rewinds = Rewinds(kafka)  # type: ignore[arg-type]
    rewinds.rewind({("t", 0): 5, ("t", 1): 7})  # partition 0 fails, 1 fails, ...
    assert rewinds
    # The position stayed past the floor on partition 0: those records are dropped (their
    # commit would skip offsets 5..8) and the seek is tried again (and now works).
    kept = rewinds.admit([Record(0, 9), Record(0, 10), Record(2, 3)])
    assert offsets(kept) == [(2, 3)]
    assert not rewinds
    assert kafka.seeks[-2:] == [{("t", 0): 5}, {("t", 1): 7}]


def test_a_record_at_the_floor_clears_it_and_a_lower_floor_wins() -> None:
    kafka = Kafka(failures=10)
    rewinds = Rewinds(kafka)  # type: ignore[arg-type]
    rewinds.rewind({("t", 0): 8})
    rewinds.rewind({("t", 0): 5})  # a second outage before the first rewind took
    assert offsets(rewinds.admit([Record(0, 6)])) == []
    assert offsets(rewinds.admit([Record(0, 5), Record(0, 6)])) == [(0, 5), (0, 6)]
    assert not rewinds


def test_revoked_partitions_forget_their_floor() -> None:
    rewinds = Rewinds(Kafka(failures=10))  # type: ignore[arg-type]
    rewinds.rewind({("t", 0): 5})
    rewinds.forget([("t", 0)])
    assert not rewinds
