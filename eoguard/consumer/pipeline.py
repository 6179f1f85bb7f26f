"""The consumer's batches between consume and commit, with their Redis round trips in flight.

Redis works while the consumer does: each round trip (a :class:`RoundTrip`) is read (it
*lands*) ``FLIGHTS_OUT`` polls after it was sent, when its answer is needed: claims before
their batch is handled, done marks before their batch's offsets are committed. Two round
trips are out at a time, so Redis has the next one queued while it answers the other (with
one, the consumer waited on Redis for ~19% of its time in ``bench.bench_consumer``, on two
cores shared with Redis and the broker). Every round trip has a connection of its own
(:meth:`eoguard.store.dedup.DedupStore.send`), so one waiting does not hold up another.

The timeline of a batch B decoded at poll k, in the steady state (each poll handles one
batch and sends one round trip; a run of reads starts by claiming what it read at once). Each
row is one function of :class:`Pipeline`:

    ====  ===================================================================  ==========
    poll  what happens to B (the function)                                     B's stage
    ====  ===================================================================  ==========
    k     consumed and decoded, Steps 1-3 (:meth:`~Pipeline.read_ahead`)       DECODED
    k     its claims sent, under a token of its own, in the round trip of      CLAIMING
          the batch handled at k (:meth:`~Pipeline.handle`)
    k+2   its claims land: what is ours kept, BUSY set aside                   CLAIMED
          (:meth:`~Pipeline._claims_land`)
    k+3   handled, Steps 5-6; its done marks sent, after the claims of the     MARKING
          batches decoded since, in one round trip (:meth:`~Pipeline.handle`)
    k+5   its done marks land: what was marked done counted, what to retry    MARKING
          planned (:meth:`~Pipeline._done_lands`)
    k+5   Step 7: retries and BUSY waits, at once, each round one claim pass   MARKING
          with two round trips of its own (:meth:`~Pipeline._retry`)
    k+5   Step 8: dead letters flushed, offsets stored and committed in        COMMITTED
          consume order (:meth:`~Pipeline._commit_batch`)
    ====  ===================================================================  ==========

A batch with messages to retry, or BUSY ones, lands its done marks in the poll that handled
it. When no more records come, the pipeline lands what is in flight at the next poll, so a
lone message is handled in the poll that read it and committed in the next.

Overlap buys throughput at the price of latency: three polls between read and handled. So it
is used only when the consumer is behind. While it keeps up - the last read brought fewer
than ``light_below`` records (a quarter of ``batch_size`` in GuardedConsumer) - a batch read
at poll k is claimed and handled at k, and its done marks land at k+1 (which waits up to
``MARKING_WAIT_S`` for records meanwhile), after the claims of the batch read then were sent:
the done marks are answered while the consumer reads Kafka, and a poll waits on Redis for its
claims only (with ``appendfsync always`` each reply waits for an fsync; waiting for both, the
poll loop of bench.bench_poll_loop spent half its time at 20% load waiting on Redis). Once reads
fill up again (the consumer fell behind), overlap resumes.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Message

from eoguard.consumer.batch import BatchProcessor, Send
from eoguard.consumer.dead_letter import DeadLetterRouter
from eoguard.consumer.handler import Inbound
from eoguard.consumer.state import Batch, BatchStage
from eoguard.errors import StoreError
from eoguard.kafka.consumer import Partition
from eoguard.store.dedup import ClaimReport, DoneReport
from eoguard.store.scripts import Prepared

__all__ = ["FLIGHTS_OUT", "MARKING_WAIT_S", "Landed", "Pipeline", "RoundTrip", "Send"]

FLIGHTS_OUT = 2
"""Round trips sent and not read yet, in the steady state."""

MARKING_WAIT_S = 0.01
"""How long a poll with only done marks in flight waits for records before it lands them:
about an AOF fsync (``appendfsync always``), so a record arriving meanwhile has its claims
sent while Redis answers the done marks, and a commit waits no longer than this for it."""

class Landed(NamedTuple):
    """A round trip's replies, by part: each claimed batch with its claim report, and the
    done report of the batch it marked (None when it marked none)."""

    claimed: list[tuple[Batch, ClaimReport]]
    done: DoneReport | None


class RoundTrip:
    """One round trip to Redis: the claims of the batches in ``claims``, then the done marks
    of ``done`` (its ``ok`` messages handled, its other claims released); either may be empty."""

    __slots__ = ("_read", "_tried", "claims", "done", "failed", "ok")

    def __init__(self, batches: BatchProcessor, send: Send, *, claims: Sequence[Batch] = (),
                 done: Batch | None = None, ok: Sequence[Inbound] = (),
                 failed: Sequence[Inbound] = ()) -> None:
        self.claims = list(claims)
        self.done, self.ok, self.failed = done, list(ok), list(failed)
        prepared: list[Prepared[Any]] = [batches.claim_call(batch) for batch in self.claims]
        if done is not None:
            prepared.append(batches.done_call(done, self.ok))
        self._read = send(prepared)  # may raise: then no batch moved on
        for batch in self.claims:
            batch.advance(BatchStage.CLAIMING)
        if done is not None:
            done.advance(BatchStage.MARKING)
        self._tried = False

    def land(self) -> Landed:
        """The replies, by part (read once); raises as :meth:`InFlight.wait` does, and
        StoreError when its landing failed before (its batches are to be re-read)."""
        if self._tried:
            raise StoreError("a round trip failed while it landed; its batches are re-read")
        self._tried = True
        replies = self._read()
        reports: list[ClaimReport] = replies[:len(self.claims)]
        done: DoneReport | None = replies[len(self.claims)] if self.done is not None else None
        return Landed(list(zip(self.claims, reports, strict=True)), done)

    def abandon(self) -> None:
        """Read and drop the replies, if not read yet, so the connection goes back (a rewind
        re-reads the batch anyway); an error here is the one the rewind is handling."""
        if not self._tried:
            with contextlib.suppress(Exception):  # the caller is already handling a failure
                self.land()


class Pipeline:
    """Batches consumed and not committed yet: Steps 4-8 of the consumer loop, overlapped.

    The pipeline holds the batch being handled, one claimed in reserve, those whose claims
    are in flight and the one just decoded (:meth:`wants_more` until enough are ahead), and
    ``FLIGHTS_OUT`` whose done marks are in flight (the module docstring has the timeline).
    Its round trips are made by ``round_trip`` (trace mode's stamp their batches).
    """

    round_trip: type[RoundTrip] = RoundTrip

    def __init__(self, batches: BatchProcessor, dead: DeadLetterRouter, *,
                 commit: Callable[[dict[Partition, int]], None], light_below: int = 0) -> None:
        self._batches, self._dead = batches, dead
        self._light_below = light_below
        self._keeping_up = False  # the last read was light: no overlap (module docstring)
        self._send, self._commit = batches.send, commit
        self._decoded: list[Batch] = []  # claims not sent yet
        self._flights: deque[RoundTrip] = deque()  # in send order
        self._claimed: deque[Batch] = deque()  # claims read: handled next, in order

    @property
    def idle(self) -> bool:
        """Nothing consumed is waiting to be handled or committed."""
        return not (self._decoded or self._flights or self._claimed)

    @property
    def marking_only(self) -> bool:
        """Nothing is waiting to be handled: what is in flight is done marks only (a
        consumer keeping up, between two reads; the poll may wait a little for records)."""
        return not (self._decoded or self._claimed or any(f.claims for f in self._flights))

    def wants_more(self) -> bool:
        """Whether fewer batches are read ahead than keep Redis answering while we work."""
        ahead = len(self._claimed) + len(self._decoded)
        return ahead + sum(len(f.claims) for f in self._flights) < FLIGHTS_OUT + 2

    def held(self) -> list[Batch]:
        """Every batch consumed and not committed yet."""
        done = [f.done for f in self._flights if f.done is not None]
        return [*done, *self._claimed, *(b for f in self._flights for b in f.claims),
                *self._decoded]

    def read_ahead(self, raw: list[Message]) -> Batch | None:
        """Steps 2 and 3 for records just consumed; their claims go out with the next send.
        Returns their batch (None for no records)."""
        if not raw:
            return None
        self._keeping_up = len(raw) < self._light_below
        batch = self._batches.decode(raw)
        self._decoded.append(batch)
        return batch

    def next_batch(self) -> Batch | None:
        """The oldest claimed batch, landing round trips as needed; None when nothing is left.

        With nothing claimed, what was read goes out first, in a round trip of its own, and
        only then do the round trips in flight land: Redis answers the new claims while the
        older replies are read, instead of after them (one fsync waited for, not two).
        """
        if not self._claimed and self._decoded:  # a run starts: claim what was read, at once
            self._flights.append(self.round_trip(self._batches, self._send,
                                                 claims=self._decoded))
            self._decoded = []  # once sent: a failed send leaves them here
        while not self._claimed:
            if not self._flights:
                return None
            self._land()
        return self._claimed[0]

    def handle(self, batch: Batch) -> None:
        """Steps 5-6 for the batch :meth:`next_batch` gave, and one round trip: the claims of
        the batches decoded since, then its done marks; it lands ``FLIGHTS_OUT`` polls later
        (at the next poll while the consumer keeps up), unless this batch has messages to
        retry or BUSY ones (Step 7 needs them now).

        The claims go first: a copy, in those batches, of a message this batch handled finds
        it held (BUSY) and is claimed again once this batch's done marks land (a DUPLICATE
        then), instead of a copy of a failed message taking it over from under its retry.
        While the consumer keeps up, the next read's claims go out on their own connection
        after these done marks (:meth:`next_batch`), in either order at Redis: a copy of a
        message whose done mark was refused may then take it over; its batch handles it and
        the retry finds it a DUPLICATE, so its effects still apply once
        (tests/integration/test_light_done_in_flight.py).
        """
        ok, failed = self._batches.handle(batch.items)  # Steps 5 and 6 (outputs).
        flight = self.round_trip(self._batches, self._send, claims=self._decoded, done=batch,
                                 ok=ok, failed=failed)
        self._decoded = []  # once sent: a failed send leaves every batch where it was
        self._flights.append(flight)
        self._claimed.popleft()
        keep = 0 if failed or batch.busy else 1 if self._keeping_up else FLIGHTS_OUT
        while len(self._flights) > keep:
            self._land()

    def land_all(self) -> None:
        """Land every round trip: the claims sent are then held, the done marks committed."""
        while self._flights:
            self._land()

    def drop(self, partitions: set[Partition] | None) -> list[Batch]:
        """Forget the records of ``partitions`` (None: all) not in flight; returns the claimed
        batches dropped whole, whose claims the caller gives back (a batch keeping records of
        other partitions releases the dropped ones with its done marks). Land first."""
        dropped: list[Batch] = []
        for batch in [*self._claimed, *self._decoded]:
            if partitions is not None:
                batch.drop(partitions)
            if partitions is None or not batch.ends:  # nothing of it is left to commit
                if batch.stage is BatchStage.CLAIMED:
                    dropped.append(batch)
                batch.advance(BatchStage.DROPPED)
        self._claimed = deque(b for b in self._claimed if b.stage is not BatchStage.DROPPED)
        self._decoded = [b for b in self._decoded if b.stage is not BatchStage.DROPPED]
        return dropped

    def forget(self, partitions: set[Partition]) -> None:
        """Drop the records of ``partitions`` from every batch, in flight or not (a rebalance
        hook that could not land the round trips): their claims lapse, or are released by
        their batch's done marks."""
        for batch in self.held():
            batch.drop(partitions)

    def abandon(self) -> None:
        """Forget every batch: round trips read and dropped (what was claimed is MINE, what
        was done is DONE_HERE when read again)."""
        for flight in self._flights:
            flight.abandon()
        for batch in self.held():
            batch.advance(BatchStage.DROPPED)
        self._flights.clear()
        self._claimed.clear()
        self._decoded.clear()

    def _land(self) -> None:
        """Read the oldest round trip: its claims land, then the done marks it carried."""
        flight = self._flights[0]
        landed = flight.land()
        self._claims_land(landed.claimed)
        flight.claims = []
        done = flight.done
        if done is not None and landed.done is not None:
            retry, wait_s = self._done_lands(flight, done, landed.done)
            self._retry(done, retry, wait_s)  # Step 7.
            self._commit_batch(done)  # Step 8.
        self._flights.popleft()

    def _claims_land(self, claimed: list[tuple[Batch, ClaimReport]]) -> None:
        """Each batch keeps what its claims made ours (BUSY set aside) and queues up to be
        handled, in order."""
        for batch, report in claimed:
            self._batches.sort_claims(batch, report)
            batch.advance(BatchStage.CLAIMED)
            self._claimed.append(batch)  # held as claimed now

    def _done_lands(self, flight: RoundTrip, batch: Batch, report: DoneReport
                    ) -> tuple[list[Inbound], float]:
        """Count what ``batch``'s done marks marked done; what goes back to Step 4 (failed,
        refused, BUSY) and the wait before it."""
        again = self._batches.sort_done(batch, flight.ok, report)
        # handled_any: the done marks of the batches before this one have landed, so a
        # BUSY copy of one of their messages is done now and is claimed again at once.
        return self._batches.plan(flight.failed + again, batch, handled_any=True)

    def _retry(self, batch: Batch, retry: list[Inbound], wait_s: float) -> None:
        """Step 7: Steps 4-7 again for ``retry`` until nothing of ``batch`` is left to retry;
        each round one claim pass, its claims and its done marks each a round trip of their
        own, sent and landed at once (the batch's offsets wait on it)."""
        batches, send = self._batches, self._send
        while retry:
            if wait_s > 0:
                time.sleep(wait_s)
            batch.items = retry
            [claimed] = send([batches.claim_call(batch)])()
            batches.sort_claims(batch, claimed)
            ok, failed = batches.handle(batch.items)
            [report] = send([batches.done_call(batch, ok)])()
            failed += batches.sort_done(batch, ok, report)
            retry, wait_s = batches.plan(failed, batch, handled_any=bool(ok))

    def _commit_batch(self, batch: Batch) -> None:
        """Step 8: its dead letters flushed, then its offsets stored and committed."""
        self._dead.flush()
        self._commit(batch.ends)
        batch.advance(BatchStage.COMMITTED)
