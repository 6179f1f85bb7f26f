"""The consumer's batches between consume and commit, with their Redis round trips in flight.

Redis works while the consumer does: a batch's claims go out as soon as it is decoded, its done
marks as soon as it is handled, and each reply is read (the flight *lands*) only when it is
needed, a poll later: the claims before the batch is handled, the done marks before its offsets
are committed. Every flight has a connection of its own
(:meth:`eoguard.store.dedup.DedupStore.send`), so one waiting does not hold up another.

Batches move through three queues, in consume order: claims in flight -> claimed (to handle)
-> done marks in flight; they leave the last one committed, so offsets are committed in order.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Message

from eoguard.guard.batch import Batch, BatchProcessor
from eoguard.guard.dead_letter import DeadLetterRouter
from eoguard.guard.handler import Inbound
from eoguard.kafka.consumer import Partition
from eoguard.store.dedup import DedupStore
from eoguard.store.scripts import Prepared

__all__ = ["Flight", "Pipeline", "Send"]

Send = Callable[[list[Prepared[Any]]], Callable[[], list[Any]]]
"""Sends prepared calls in one round trip; the function returned reads their parsed replies."""


class Flight:
    """One round trip sent for ``batch``: its claims, or (``ok`` set) its done marks and the
    release of its ``failed`` messages."""

    __slots__ = ("_read", "_tried", "batch", "failed", "ok")

    def __init__(self, batch: Batch, read: Callable[[], list[Any]], *,
                 ok: list[Inbound] | None = None, failed: Sequence[Inbound] = ()) -> None:
        self.batch = batch
        self.ok = ok
        self.failed = list(failed)
        self._read = read
        self._tried = False

    def land(self) -> list[Any]:
        """The parsed replies (read once); raises as :meth:`InFlight.wait` does."""
        if self._tried:
            raise RuntimeError("a flight lands once")
        self._tried = True
        return self._read()

    def abandon(self) -> None:
        """Read and drop the replies, if not read yet, so the connection goes back (a rewind
        re-reads the batch anyway); an error here is the one the rewind is handling."""
        if not self._tried:
            with contextlib.suppress(Exception):  # the caller is already handling a failure
                self.land()


class Pipeline:
    """Batches consumed and not committed yet: Steps 4-8 of the consumer loop, overlapped."""

    def __init__(self, batches: BatchProcessor, dedup: DedupStore, dead: DeadLetterRouter, *,
                 send: Send, commit: Callable[[dict[Partition, int]], None]) -> None:
        self._batches, self._dedup, self._dead = batches, dedup, dead
        self._send, self._commit = send, commit
        self._claiming: deque[Flight] = deque()  # claims in flight
        self._claimed: deque[Batch] = deque()  # claims read: handled next, in order
        self._marking: deque[Flight] = deque()  # done marks in flight: committed when read

    @property
    def idle(self) -> bool:
        """Nothing consumed is waiting to be handled or committed."""
        return not (self._claiming or self._claimed or self._marking)

    @property
    def claims_in_flight(self) -> int:
        return len(self._claiming)

    def held(self) -> list[Batch]:
        """Every batch consumed and not committed yet, in consume order."""
        return [*(f.batch for f in self._marking), *self._claimed,
                *(f.batch for f in self._claiming)]

    def read_ahead(self, raw: list[Message]) -> None:
        """Steps 2 and 3 for records just consumed, and their claims sent (Step 4)."""
        if not raw:
            return
        batch = self._batches.decode(raw)
        self._claiming.append(Flight(batch, self._send([self._dedup.prepare_claim(
            batch.claims())])))

    def next_batch(self) -> Batch | None:
        """The oldest claimed batch (its claims landed now if need be); None when none."""
        if not self._claimed and self._claiming:
            self._land_claims()
        return self._claimed[0] if self._claimed else None

    def handle(self, batch: Batch) -> None:
        """Steps 5-6 for the batch :meth:`next_batch` gave; its done marks land a poll later,
        unless it has messages to retry (Step 7 needs them now)."""
        ok, failed = self._batches.handle(batch.items)  # Steps 5 and 6 (outputs).
        prepared: list[Prepared[Any]] = [self._batches.prepare_done(ok)]
        if failed:
            prepared.append(self._dedup.prepare_release(self._batches.let_go(failed)))
        self._marking.append(Flight(batch, self._send(prepared), ok=ok, failed=failed))
        self._claimed.popleft()
        keep = 0 if failed or batch.busy else 1
        while len(self._marking) > keep:
            self._land_done()

    def land_done(self) -> None:
        """Land every done mark in flight: their batches are committed."""
        while self._marking:
            self._land_done()

    def land_all(self) -> None:
        """Land every flight: the claims sent are then held, the done marks committed."""
        while self._claiming:
            self._land_claims()
        self.land_done()

    def drop(self, partitions: set[Partition] | None) -> list[Inbound]:
        """Forget the claimed records of ``partitions`` (None: all); returns their items, whose
        claims the caller releases or lets lapse. Land the flights first."""
        held: list[Inbound] = []
        for batch in self._claimed:
            held += batch.items if partitions is None else batch.drop(partitions)
        if partitions is None:
            self._claimed.clear()
        return held

    def forget(self, partitions: set[Partition]) -> None:
        """Drop the records of ``partitions`` from every batch, in flight or not (a rebalance
        hook that could not land the flights): their claims lapse."""
        for batch in self.held():
            self._batches.let_go(batch.drop(partitions))

    def abandon(self) -> None:
        """Forget every batch: flights read and dropped (what was claimed is MINE, what was
        done is REDELIVERED when read again)."""
        for flight in (*self._marking, *self._claiming):
            flight.abandon()
        self._marking.clear()
        self._claimed.clear()
        self._claiming.clear()

    def _land_claims(self) -> None:
        flight = self._claiming[0]
        [report] = flight.land()
        self._claiming.popleft()
        self._batches.sort(flight.batch, report)
        self._claimed.append(flight.batch)

    def _land_done(self) -> None:
        """Read the oldest done marks in flight; Steps 7 and 8 for their batch."""
        flight = self._marking[0]
        batch, ok, batches = flight.batch, flight.ok or [], self._batches
        [report, *_] = flight.land()
        refused = batches.settle_done(ok, report)
        if refused:  # rare: effects refused, or the claim vanished
            self._dedup.release(batches.let_go(refused))
        # handled_any: the done marks of the batches before this one have landed, so a BUSY
        # copy of one of their messages is DONE now and is claimed again at once.
        retry, wait_s = batches.plan(flight.failed + refused, batch, handled_any=True)
        batches.finish(batch, retry, wait_s)  # Step 7, one round trip per retry round.
        self._dead.flush()  # Step 8.
        self._commit(batch.ends)
        self._marking.popleft()
