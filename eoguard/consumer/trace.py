"""Trace mode: when each message reached each stage of the consumer, to say where latency goes.

With ``ConsumerConfig.trace_messages`` > 0, :class:`GuardedConsumer` runs a
:class:`TracedPipeline`: the pipeline of :mod:`eoguard.consumer.pipeline` with each batch
stamped at every :class:`~eoguard.consumer.state.Stamp` (read, claims sent, claims landed,
handled, done sent, done landed, committed). The messages of a batch share their stamps: one
``time.perf_counter_ns()`` per stage and batch, and a tuple per message handled, made when its
batch is. A committed batch's stamps go into a ring that keeps the last
``trace_messages`` messages; :meth:`GuardedConsumer.trace` returns them as
:class:`TraceRecord`, in epoch nanoseconds (comparable with ``created_at_ms`` and other
processes' clocks on the same machine).

With tracing off the plain :class:`~eoguard.consumer.pipeline.Pipeline` runs: the hot path
tests nothing; a batch costs one ``None`` stored in its ``stamps``.

A message is traced when its batch's first pass gave it to the handler; a retried one keeps
that pass's stamps (its retries show in done landed -> committed). Batches dropped or rewound
are not traced; their records, read again, are.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from eoguard.consumer.batch import BatchProcessor, Send
from eoguard.consumer.dead_letter import DeadLetterRouter
from eoguard.consumer.handler import Inbound
from eoguard.consumer.pipeline import Landed, Pipeline, RoundTrip
from eoguard.consumer.state import Batch, BatchStamps, Stamp
from eoguard.errors import StateError
from eoguard.kafka.consumer import Partition

__all__ = ["TraceRecord", "TraceRing", "TracedPipeline", "TracedRoundTrip"]

_now = time.perf_counter_ns


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One message's way through the consumer: the envelope's ``created_at_ms`` (for a plain
    record its Kafka timestamp), then when its batch reached each stage, in epoch ns."""

    message_id: str
    created_at_ms: int
    read_ns: int
    claims_sent_ns: int
    claims_landed_ns: int
    handled_ns: int
    done_sent_ns: int
    done_landed_ns: int
    committed_ns: int

    def stamps_ns(self) -> tuple[int, ...]:
        """The seven stage stamps, in :class:`~eoguard.consumer.state.Stamp` order."""
        return (self.read_ns, self.claims_sent_ns, self.claims_landed_ns, self.handled_ns,
                self.done_sent_ns, self.done_landed_ns, self.committed_ns)


class TraceRing:
    """The stamps of the last ``keep`` messages committed, kept per batch (oldest dropped)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._batches: deque[BatchStamps] = deque()
        self._kept = 0  # messages in _batches
        # perf_counter_ns -> epoch ns, fixed once: stamps keep perf_counter's order
        self._epoch_ns = time.time_ns() - _now()

    def add(self, stamps: BatchStamps) -> None:
        self._batches.append(stamps)
        self._kept += len(stamps.messages)
        while self._kept > self.keep:
            oldest = self._batches[0]
            over = self._kept - self.keep
            if over < len(oldest.messages):  # keep its newest messages
                del oldest.messages[:over]
                self._kept -= over
            else:
                self._batches.popleft()
                self._kept -= len(oldest.messages)

    def records(self) -> list[TraceRecord]:
        """Every message kept, oldest batch first."""
        out: list[TraceRecord] = []
        epoch = self._epoch_ns
        for stamps in self._batches:
            at = [ns + epoch for ns in stamps.at]
            out += [TraceRecord(mid, created, *at) for mid, created in stamps.messages]
        return out


def _stamps(batch: Batch) -> BatchStamps:
    """A batch's stamps; every batch of a traced pipeline got them when it was read."""
    if batch.stamps is None:
        raise StateError("a batch of the traced pipeline was never stamped as read")
    return batch.stamps


class TracedRoundTrip(RoundTrip):
    """A round trip that stamps its batches: handled (when it carries done marks, it is made
    right after their handler ran), claims and done sent, claims and done landed."""

    __slots__ = ()

    def __init__(self, batches: BatchProcessor, send: Send, *, claims: Sequence[Batch] = (),
                 done: Batch | None = None, ok: Sequence[Inbound] = (),
                 failed: Sequence[Inbound] = ()) -> None:
        handled_ns = _now()
        super().__init__(batches, send, claims=claims, done=done, ok=ok, failed=failed)
        sent_ns = _now()
        for batch in self.claims:
            _stamps(batch).at[Stamp.CLAIMS_SENT] = sent_ns
        if done is not None:
            stamps = _stamps(done)
            stamps.at[Stamp.HANDLED] = handled_ns
            stamps.at[Stamp.DONE_SENT] = sent_ns
            stamps.messages = [(item.envelope.id, item.envelope.created_at_ms)
                               for item in (*self.ok, *self.failed)]

    def land(self) -> Landed:
        landed = super().land()
        landed_ns = _now()
        for batch in self.claims:
            _stamps(batch).at[Stamp.CLAIMS_LANDED] = landed_ns
        if self.done is not None:
            _stamps(self.done).at[Stamp.DONE_LANDED] = landed_ns
        return landed


class TracedPipeline(Pipeline):
    """The consumer's pipeline, each batch stamped at every stage; committed batches' stamps
    kept in a :class:`TraceRing` of ``config.trace_messages`` messages."""

    round_trip = TracedRoundTrip

    def __init__(self, batches: BatchProcessor, dead: DeadLetterRouter, *,
                 commit: Callable[[dict[Partition, int]], None], light_below: int = 0) -> None:
        super().__init__(batches, dead, commit=commit, light_below=light_below)
        self.ring = TraceRing(batches.config.trace_messages)

    def read_ahead(self, raw: list[Message]) -> Batch | None:
        read_ns = _now()  # the records are out of Kafka: decoding is the pipeline's time
        batch = super().read_ahead(raw)
        if batch is not None:
            batch.stamps = BatchStamps(read_ns)
        return batch

    def _commit_batch(self, batch: Batch) -> None:
        super()._commit_batch(batch)
        stamps = _stamps(batch)
        stamps.at[Stamp.COMMITTED] = _now()
        self.ring.add(stamps)
