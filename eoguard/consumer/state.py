"""The consumer's state between consume and commit: its batches, their stages, its counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from confluent_kafka import Message

from eoguard.consumer.handler import Inbound
from eoguard.errors import StateError
from eoguard.kafka.consumer import Partition
from eoguard.store.dedup import Claim

__all__ = ["Batch", "BatchStage", "BatchStamps", "ConsumerStats", "Stamp"]


@dataclass(slots=True)
class ConsumerStats:
    """Counters since the consumer started (a copy is returned by ``stats()``)."""

    polled: int = 0
    handled: int = 0
    duplicates: int = 0  # DUPLICATE at claim time: handled before (by this scope)
    redelivered: int = 0  # DONE_HERE: read again after its batch was done (a commit lost)
    fenced: int = 0  # handled here, but its claim was re-owned before the done mark
    partial_effects: int = 0  # effects failed midway: marked done, dead-lettered, needs repair
    expired: int = 0
    dead_lettered: int = 0
    retries: int = 0
    busy_waits: int = 0
    busy_skipped: int = 0
    claim_round_trips: int = 0
    redis_wait_s: float = 0.0  # the poll loop blocked on Redis replies (high: Redis is the bound)
    in_flight: int = 0
    store_outages: int = 0  # batches rewound: Redis, Kafka or a plain record's service down
    commits: int = 0
    lease_renewals: int = 0  # renewal passes over the batches held (one write per record)


class BatchStage(enum.Enum):
    """Where a batch is between consume and commit (the pipeline's timeline says when)."""

    DECODED = "decoded"  # decoded; its claims not sent yet
    CLAIMING = "claiming"  # its claims in flight
    CLAIMED = "claimed"  # its claims read: what is ours waits to be handled
    MARKING = "marking"  # handled; its done marks in flight
    COMMITTED = "committed"  # done marks landed, offsets stored and committed
    DROPPED = "dropped"  # forgotten: a rewind re-reads it, or its partitions went away


_NEXT: dict[BatchStage, tuple[BatchStage, ...]] = {
    BatchStage.DECODED: (BatchStage.CLAIMING,),
    BatchStage.CLAIMING: (BatchStage.CLAIMED,),
    BatchStage.CLAIMED: (BatchStage.MARKING,),
    BatchStage.MARKING: (BatchStage.COMMITTED,),
    BatchStage.COMMITTED: (),
    BatchStage.DROPPED: (),
}


class Stamp(enum.IntEnum):
    """What trace mode stamps (:mod:`eoguard.consumer.trace`), in the order a batch gets
    there: an index into :attr:`BatchStamps.at`."""

    READ = 0  # out of Kafka, not decoded yet
    CLAIMS_SENT = 1
    CLAIMS_LANDED = 2
    HANDLED = 3  # its first pass handled (a retry's time is in DONE_LANDED -> COMMITTED)
    DONE_SENT = 4
    DONE_LANDED = 5
    COMMITTED = 6  # offsets stored and the asynchronous commit sent (not its answer)


class BatchStamps:
    """Trace mode: when a batch reached each :class:`Stamp` (``time.perf_counter_ns``), and
    the (id, created_at_ms) of the messages its first pass handled."""

    __slots__ = ("at", "messages")

    def __init__(self, read_ns: int) -> None:
        self.at = [read_ns, 0, 0, 0, 0, 0, 0]
        self.messages: list[tuple[str, int]] = []


class Batch:
    """The records of one ``consume`` call on their way from decoded to claimed to committed."""

    __slots__ = ("busy", "busy_rounds", "busy_until", "claimed", "ends", "items",
                 "lease_left_ms", "msgs", "stage", "stamps", "token")

    def __init__(self, msgs: list[Message], items: list[Inbound],
                 ends: dict[Partition, int]) -> None:
        self.msgs = msgs  # every record consumed, decoded or not: a rewind re-reads them all
        self.items = items  # decoded, unexpired; once claimed: the ones this consumer handles
        self.ends = ends  # per partition, the offset to commit: the last one consumed + 1
        self.stage = BatchStage.DECODED
        self.token = ""  # the claim pass in progress: its claims name it
        self.claimed: list[Inbound] = []  # claimed under the token: all settled by its done
        self.busy: list[Inbound] = []  # claimed by another owner whose lease is live
        self.lease_left_ms: list[int] = []  # that lease, per busy item
        self.busy_until = 0.0  # monotonic deadline of the busy waits
        self.busy_rounds = 0
        self.stamps: BatchStamps | None = None  # trace mode only

    def advance(self, stage: BatchStage) -> None:
        """Move to ``stage``; any stage may drop the batch, the rest go in order (a step out
        of order is :class:`StateError`: the pipeline lost track of the batch)."""
        if stage is not BatchStage.DROPPED and stage not in _NEXT[self.stage]:
            raise StateError(f"batch cannot go from {self.stage.value} to {stage.value}")
        self.stage = stage

    def claims(self) -> list[Claim]:
        return [item.claim for item in self.items]

    def drop(self, partitions: set[Partition]) -> list[Inbound]:
        """Forget the records of ``partitions`` (revoked or lost); returns the items dropped.

        Their claims stay in :attr:`claimed`: the batch's done lets them go (fenced)."""
        if partitions.isdisjoint(self.ends):
            return []
        gone = [item for item in self.items if (item.topic, item.partition) in partitions]
        self.items = [item for item in self.items if (item.topic, item.partition) not in partitions]
        kept = [(item, ms) for item, ms in zip(self.busy, self.lease_left_ms, strict=True)
                if (item.topic, item.partition) not in partitions]
        self.busy, self.lease_left_ms = [item for item, _ in kept], [ms for _, ms in kept]
        self.msgs = [m for m in self.msgs
                     if (m.topic() or "", m.partition() or 0) not in partitions]
        self.ends = {tp: end for tp, end in self.ends.items() if tp not in partitions}
        return gone
