"""The consumer's batches between consume and commit, with their Redis round trips in flight.

Redis works while the consumer does: each round trip (a *flight*) is read (it *lands*)
``FLIGHTS_OUT`` polls after it was sent, when its answer is needed: claims before their batch
is handled, done marks before their batch's offsets are committed. Two flights are out at a
time, so Redis has the next one queued while it answers the other (with one, the consumer
waited on Redis for ~19% of its time in ``bench.bench_consumer``, on two cores shared with
Redis and the broker). Every flight has a connection of its own
(:meth:`eoguard.store.dedup.DedupStore.send`), so one waiting does not hold up another.

A batch goes decoded -> claims in flight -> claimed (to handle) -> done marks in flight ->
committed; batches are committed in consume order.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Message

from eoguard.consumer.batch import Batch, BatchProcessor
from eoguard.consumer.dead_letter import DeadLetterRouter
from eoguard.consumer.handler import Inbound
from eoguard.errors import StoreError
from eoguard.kafka.consumer import Partition
from eoguard.store.dedup import DedupStore
from eoguard.store.scripts import Prepared

__all__ = ["FLIGHTS_OUT", "Flight", "Pipeline", "Send"]

FLIGHTS_OUT = 2
"""Round trips sent and not read yet, in the steady state."""

Send = Callable[[list[Prepared[Any]]], Callable[[], list[Any]]]
"""Sends prepared calls in one round trip; the function returned reads their parsed replies."""


class Flight:
    """One round trip sent: the done marks of ``done`` (its ``ok`` messages; its ``failed``
    ones released), then the claims of the batches in ``claims``; either part may be empty."""

    __slots__ = ("_read", "_tried", "claims", "done", "failed", "ok")

    def __init__(self, read: Callable[[], list[Any]], *, done: Batch | None = None,
                 ok: Sequence[Inbound] = (), failed: Sequence[Inbound] = (),
                 claims: Sequence[Batch] = ()) -> None:
        self.done = done
        self.ok = list(ok)
        self.failed = list(failed)
        self.claims = list(claims)
        self._read = read
        self._tried = False

    def land(self) -> list[Any]:
        """The parsed replies (read once); raises as :meth:`InFlight.wait` does, and
        StoreError when its landing failed before (its batches are to be re-read)."""
        if self._tried:
            raise StoreError("a round trip failed while it landed; its batches are re-read")
        self._tried = True
        return self._read()

    def abandon(self) -> None:
        """Read and drop the replies, if not read yet, so the connection goes back (a rewind
        re-reads the batch anyway); an error here is the one the rewind is handling."""
        if not self._tried:
            with contextlib.suppress(Exception):  # the caller is already handling a failure
                self.land()


class Pipeline:
    """Batches consumed and not committed yet: Steps 4-8 of the consumer loop, overlapped.

    One round trip per batch handled: its done marks, then the claims of the batches decoded
    since the last one. It lands ``FLIGHTS_OUT`` polls later, so a batch decoded at poll k is
    claimed at k + 2 and handled at k + 3, and its done marks land at k + 5: the pipeline holds
    the batch being handled, one claimed in reserve, ``FLIGHTS_OUT`` whose claims are in flight
    and the one just decoded (:meth:`wants_more` until it does), and ``FLIGHTS_OUT`` whose done
    marks are in flight.
    """

    def __init__(self, batches: BatchProcessor, dedup: DedupStore, dead: DeadLetterRouter, *,
                 send: Send, commit: Callable[[dict[Partition, int]], None]) -> None:
        self._batches, self._dedup, self._dead = batches, dedup, dead
        self._send, self._commit = send, commit
        self._decoded: list[Batch] = []  # claims not sent yet
        self._flights: deque[Flight] = deque()  # in send order
        self._claimed: deque[Batch] = deque()  # claims read: handled next, in order

    @property
    def idle(self) -> bool:
        """Nothing consumed is waiting to be handled or committed."""
        return not (self._decoded or self._flights or self._claimed)

    def wants_more(self) -> bool:
        """Whether fewer batches are read ahead than keep Redis answering while we work."""
        ahead = len(self._claimed) + len(self._decoded)
        return ahead + sum(len(f.claims) for f in self._flights) < FLIGHTS_OUT + 2

    def held(self) -> list[Batch]:
        """Every batch consumed and not committed yet."""
        done = [f.done for f in self._flights if f.done is not None]
        return [*done, *self._claimed, *(b for f in self._flights for b in f.claims),
                *self._decoded]

    def read_ahead(self, raw: list[Message]) -> None:
        """Steps 2 and 3 for records just consumed; their claims go out with the next send."""
        if raw:
            self._decoded.append(self._batches.decode(raw))

    def next_batch(self) -> Batch | None:
        """The oldest claimed batch, landing flights as needed; None when nothing is left."""
        while not self._claimed:
            if self._flights:
                self._land()
            elif self._decoded:  # a run starts: claim all but the newest now, on their own
                first = self._decoded[:-1] or self._decoded[:]
                flight = Flight(self._send(self._claim_calls(first)), claims=first)
                self._batches.sent(first)
                del self._decoded[:len(first)]  # once sent: a failed send leaves them here
                self._flights.append(flight)
            else:
                return None
        return self._claimed[0]

    def handle(self, batch: Batch) -> None:
        """Steps 5-6 for the batch :meth:`next_batch` gave, and one round trip: its done marks
        and the claims of the batches decoded since; it lands ``FLIGHTS_OUT`` polls later,
        unless this batch has messages to retry (Step 7 needs them now)."""
        ok, failed = self._batches.handle(batch.items)  # Steps 5 and 6 (outputs).
        claims = self._decoded
        # The claims go before the release: a copy of a failed message in the batches claimed
        # finds it still held by us (BUSY, claimed again later) instead of taking it, which
        # would leave the failed message's retries waiting on that copy.
        prepared: list[Prepared[Any]] = [self._batches.prepare_done(ok),
                                         *self._claim_calls(claims)]
        if failed:
            prepared.append(self._dedup.prepare_release(self._batches.let_go(failed)))
        flight = Flight(self._send(prepared), done=batch, ok=ok, failed=failed, claims=claims)
        self._batches.sent(claims)
        self._decoded = []  # once sent: a failed send leaves every batch where it was
        self._flights.append(flight)
        self._claimed.popleft()
        keep = 0 if failed or batch.busy else FLIGHTS_OUT
        while len(self._flights) > keep:
            self._land()

    def land_all(self) -> None:
        """Land every flight: the claims sent are then held, the done marks committed."""
        while self._flights:
            self._land()

    def drop(self, partitions: set[Partition] | None) -> list[Inbound]:
        """Forget the records of ``partitions`` (None: all) not in flight; returns the claimed
        items among them, whose claims the caller releases or lets lapse. Land first."""
        held: list[Inbound] = []
        for batch in self._claimed:
            held += batch.items if partitions is None else batch.drop(partitions)
        for batch in self._decoded:  # nothing claimed yet
            if partitions is not None:
                batch.drop(partitions)
        if partitions is None:
            self._claimed.clear()
            self._decoded.clear()
        return held

    def forget(self, partitions: set[Partition]) -> None:
        """Drop the records of ``partitions`` from every batch, in flight or not (a rebalance
        hook that could not land the flights): their claims lapse."""
        for batch in self.held():
            self._batches.let_go(batch.drop(partitions))

    def abandon(self) -> None:
        """Forget every batch: flights read and dropped (what was claimed is MINE, what was
        done is REDELIVERED when read again)."""
        for flight in self._flights:
            flight.abandon()
        self._flights.clear()
        self._claimed.clear()
        self._decoded.clear()

    def _claim_calls(self, batches: list[Batch]) -> list[Prepared[Any]]:
        return [self._dedup.prepare_claim(batch.claims()) for batch in batches]

    def _land(self) -> None:
        """Read the oldest flight: its claimed batches queue up to be handled; Steps 7 and 8
        for its done batch."""
        flight = self._flights[0]
        replies = flight.land()  # [done report], claim reports..., [release results]
        batches, done = self._batches, flight.done
        first = 0 if done is None else 1
        for report in replies[first:first + len(flight.claims)]:
            batches.sort(flight.claims[0], report)
            self._claimed.append(flight.claims.pop(0))  # held as claimed now
        if done is not None:
            refused = batches.settle_done(flight.ok, replies[0])
            if refused:  # rare: effects refused, or the claim vanished
                self._dedup.release(batches.let_go(refused))
            # handled_any: the done marks of the batches before this one have landed, so a
            # BUSY copy of one of their messages is DONE now and is claimed again at once.
            retry, wait_s = batches.plan(flight.failed + refused, done, handled_any=True)
            batches.finish(done, retry, wait_s)  # Step 7, one round trip per retry round.
            self._dead.flush()  # Step 8.
            self._commit(done.ends)
        self._flights.popleft()
