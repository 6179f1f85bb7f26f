"""The consumer pipeline's steps between I/O, over a stub sender (pure logic, no services).

The stub answers each script call with what the test scripts for it (claim codes per message
id, done codes), as Redis would encode them, and records every round trip: which scripts,
under which tokens, in which order. Real Redis, Kafka and the whole consumer are tested in
tests/integration and tests/fault; here the order of the steps is pinned: when a batch's
claims go out and land, when it is handled, when its done marks go and its offsets commit,
and what retries and BUSY waits send.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.batch import BatchProcessor
from eoguard.consumer.dead_letter import DeadLetterRouter
from eoguard.consumer.handler import ContextEnv, HandlerContext
from eoguard.consumer.leases import BatchLeases
from eoguard.consumer.pipeline import FLIGHTS_OUT, Pipeline
from eoguard.consumer.state import Batch, BatchStage
from eoguard.consumer.trace import TracedPipeline
from eoguard.errors import StoreError
from eoguard.stack.feed import envelope
from eoguard.store.dedup import Claim, ClaimReport, ClaimResult, DedupStore, DoneResult
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import Prepared
from tests.consumer_kit import Record

CODEC = EnvelopeCodec()


class Sink:
    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: bytes, key: Any = None, headers: Any = None) -> None:
        self.produced.append((topic, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


class ScriptedStore(DedupStore):
    """Claims by the script only, the calls :class:`Stub` answers: a fresh pass's plain
    commands (store/dedup_fresh.py) are tested against Redis (tests/integration/
    test_dedup_fresh.py), and the pipeline sends what the store prepares either way."""

    def prepare_claim(self, token: str, claims: Sequence[Claim], *, give_up_busy: bool = False,
                      fresh: bool = False) -> Prepared[ClaimReport]:
        return super().prepare_claim(token, claims, give_up_busy=give_up_busy)


class Stub:
    """Answers round trips with scripted codes; records (script, token, ids) per call."""

    def __init__(self, store: DedupStore) -> None:
        self.store = store
        self.trips: list[list[tuple[str, str, list[str]]]] = []
        self.claim_codes: dict[str, list[ClaimResult]] = {}  # per id: answers, in turn
        self.done_codes: dict[str, list[DoneResult]] = {}
        self.fail_next_landing = False
        self.busy_held_by_self = False  # BUSY claims are held by the claiming pass itself
        self.written: dict[str, list[str]] = {}  # per token: the claim keys it wrote

    def send(self, prepared: list[Prepared[Any]]) -> Callable[[], list[Any]]:
        trip: list[tuple[str, str, list[str]]] = []
        raw: list[list[Any]] = []
        for p in prepared:
            replies = []
            for call in p.calls:
                keys, args = list(call.keys), call.args
                token = str(args[0])
                if call.script == "dedup_claim":
                    groups = int(args[4])
                    claim_keys = keys[2 * groups:]
                    ids = [key.rsplit(":", 1)[-1] for key in claim_keys]
                    codes = [self._next(self.claim_codes, i, ClaimResult.NEW) for i in ids]
                    holder = token.encode() if self.busy_held_by_self else b"another-consumers"
                    busy: list[Any] = []
                    for c in codes:
                        if c is ClaimResult.BUSY:
                            busy += [5_000, holder]
                    self.written.setdefault(token, []).extend(
                        k for k, c in zip(claim_keys, codes, strict=True) if c.should_handle)
                    replies.append([bytes(48 + c.value for c in codes), busy])
                else:  # dedup_done: a simple pass names no claim key; report by re-owned list
                    groups, n = int(args[1]), int(args[2])
                    claim_keys = keys[2 * groups:2 * groups + n] if n else self.written[token]
                    ids = [key.rsplit(":", 1)[-1] for key in claim_keys]
                    codes = [self._next(self.done_codes, i, DoneResult.OK) for i in ids]
                    reasons = [b"scripted" for c in codes
                               if c in (DoneResult.EFFECT_ERROR, DoneResult.PARTIAL)]
                    if n:
                        replies.append([bytes(48 + c.value for c in codes), reasons, []])
                    else:
                        listed = [x for k, c in zip(claim_keys, codes, strict=True)
                                  if c is not DoneResult.OK for x in (k.encode(), b"%d" % c.value)]
                        replies.append([b"", reasons, listed])
                trip.append((call.script, token, ids))
            raw.append(replies)
        self.trips.append(trip)
        fail, self.fail_next_landing = self.fail_next_landing, False

        def land() -> list[Any]:
            if fail:
                raise StoreError("Redis went away")
            return [p.parse(r) for p, r in zip(prepared, raw, strict=True)]
        return land

    @staticmethod
    def _next(table: dict[str, list[Any]], key: str, default: Any) -> Any:
        answers = table.get(key)
        return answers.pop(0) if answers else default


class Harness:
    def __init__(self, handler: Callable[[HandlerContext], None] | None = None, *,
                 light_below: int = 0, trace_messages: int = 0) -> None:
        keys = KeySpace(prefix="unit")
        config = ConsumerConfig(kafka={"bootstrap.servers": "unused:9092", "group.id": "g"},
                                redis=RedisConfig(url="redis://127.0.0.1:1/0"), scope="app",
                                topics=("t",), keyspace=keys, retry_backoff_s=0.001,
                                retry_backoff_max_s=0.002, busy_wait_s=5.0,
                                trace_messages=trace_messages)
        # A client that is never connected: preparing calls touches no server.
        store = ScriptedStore(redis.Redis(port=1), scope="app", keys=keys)
        self.stub = Stub(store)
        self.sink = Sink()
        self.handled: list[str] = []
        self.commits: list[dict[Any, int]] = []
        self.leases = BatchLeases(store, interval_s=3600, max_hold_s=3600)
        dead = DeadLetterRouter(self.sink, topic="dlq", scope="app")  # type: ignore[arg-type]
        env = ContextEnv("app", keys, False, "unit", CODEC, PayloadCodec())
        self.batches = BatchProcessor(config, dedup=store, outbox=None, sink=self.sink,  # type: ignore[arg-type]
                                      dead=dead, env=env, leases=self.leases,
                                      send=self.stub.send,
                                      handler=handler or (lambda ctx: self.handled.append(ctx.message_id)),
                                      batch_handler=None)
        pipeline = TracedPipeline if trace_messages else Pipeline
        self.pipe = pipeline(self.batches, dead, commit=self.commits.append,
                             light_below=light_below)
        self.offset = 0

    def records(self, count: int) -> tuple[list[Any], list[str]]:
        envs = [envelope(b"m") for _ in range(count)]
        recs = [Record(self.offset + i, CODEC.encode(e)) for i, e in enumerate(envs)]
        self.offset += count
        return recs, [e.id for e in envs]

    def poll(self, count: int, *, supply: list[list[Any]] | None = None) -> Batch | None:
        """One poll as GuardedConsumer.poll_once runs it: read a batch of ``count`` records
        (or the next of ``supply``), read ahead while the pipeline wants more, handle one."""
        if supply is not None:
            if supply:
                self.pipe.read_ahead(supply.pop(0))
            while supply and self.pipe.wants_more():
                self.pipe.read_ahead(supply.pop(0))
        elif count:
            self.pipe.read_ahead(self.records(count)[0])
        batch = self.pipe.next_batch()
        if batch is not None:
            self.pipe.handle(batch)
        return batch

    def close(self) -> None:
        self.leases.close()


@pytest.fixture
def harness() -> Any:
    h = Harness()
    yield h
    h.close()


def scripts(trip: list[tuple[str, str, list[str]]]) -> list[str]:
    return [script for script, _, _ in trip]


def test_the_timeline_of_the_module_docstring(harness: Harness) -> None:
    supply = [harness.records(3)[0] for _ in range(12)]
    stages: list[dict[int, BatchStage]] = []  # per poll: each batch's stage after it
    seen: list[Batch] = []
    for _ in range(12):
        harness.poll(0, supply=supply)
        seen += [b for b in harness.pipe.held() if b not in seen]
        stages.append({seen.index(b): b.stage for b in seen})
    def when(batch: int, stage: BatchStage) -> int:
        return next(k for k, poll in enumerate(stages) if poll.get(batch) is stage)
    # A batch read in the steady state (read at poll k, its claims sent at k): claimed at
    # k + 2, handled and its done marks sent at k + 3, committed at k + 5.
    for b in range(4, 7):
        read = when(b, BatchStage.CLAIMING)
        assert when(b, BatchStage.CLAIMED) - read == FLIGHTS_OUT, (b, stages)
        assert when(b, BatchStage.MARKING) - read == FLIGHTS_OUT + 1, (b, stages)
        assert when(b, BatchStage.COMMITTED) - read == 2 * FLIGHTS_OUT + 1, (b, stages)
    # Every round trip of the steady state: the claims of the batch read, then the done
    # marks of the batch handled, in that order; tokens unique per claim pass and named again
    # by that pass's done marks.
    steady = harness.stub.trips[2:8]
    assert all(scripts(trip) == ["dedup_claim", "dedup_done"] for trip in steady), steady
    claim_tokens = [t for trip in harness.stub.trips for s, t, _ in trip if s == "dedup_claim"]
    done_tokens = [t for trip in harness.stub.trips for s, t, _ in trip if s == "dedup_done"]
    assert len(set(claim_tokens)) == len(claim_tokens)
    assert set(done_tokens) <= set(claim_tokens)
    # Offsets commit in consume order.
    committed = [b for b in seen if b.stage is BatchStage.COMMITTED]
    assert committed == seen[:len(committed)]
    assert harness.commits == [b.ends for b in committed]


def test_a_consumer_that_keeps_up_handles_in_the_poll_that_read_and_commits_in_the_next() -> None:
    harness = Harness(light_below=10)
    read: list[Batch] = []  # every batch, as read_ahead made it
    decode = harness.batches.decode

    def decoded(raw: list[Any]) -> Batch:
        read.append(decode(raw))
        return read[-1]
    harness.batches.decode = decoded  # type: ignore[method-assign]
    stages: list[dict[int, BatchStage]] = []  # per poll: each batch's stage after it
    trips: list[int] = []  # per poll: round trips sent
    try:
        for _ in range(6):  # light reads (3 < 10 records), one per poll: a consumer keeping up
            before = len(harness.stub.trips)
            harness.poll(3)
            trips.append(len(harness.stub.trips) - before)
            stages.append({b: batch.stage for b, batch in enumerate(read)})
        light = len(read)
        full = [harness.records(12)[0] for _ in range(8)]  # full reads: it fell behind
        while full:
            harness.poll(0, supply=full)
            stages.append({b: batch.stage for b, batch in enumerate(read)})
    finally:
        harness.close()

    def when(batch: int, stage: BatchStage) -> int:
        return next(k for k, at in enumerate(stages) if at.get(batch) is stage)
    assert light == 6
    # Light reads: claimed and handled in the poll that read them (its done marks sent, not
    # waited for), committed in the next, as the next batch's claims go out.
    for b in range(light - 1):
        assert when(b, BatchStage.MARKING) == b, (b, stages)
        assert when(b, BatchStage.COMMITTED) == b + 1, (b, stages)
    # Two round trips a poll (claims, done marks), and no poll ends with claims unread.
    assert trips == [2] * 6, trips
    assert all(BatchStage.CLAIMING not in at.values() for at in stages[:light]), stages[:light]
    # Full reads: round trips overlap again (claims in flight while a batch is handled).
    assert any(BatchStage.CLAIMING in at.values() for at in stages[light:]), stages[light:]


def test_a_lone_message_is_handled_in_the_poll_that_read_it(harness: Harness) -> None:
    batch = harness.poll(1)
    assert batch is not None
    assert len(harness.handled) == 1
    assert batch.stage is BatchStage.MARKING
    assert harness.poll(0) is None  # the next poll lands its done marks
    assert batch.stage is BatchStage.COMMITTED
    assert harness.pipe.idle


def test_busy_waits_then_duplicate_without_blocking_the_batch(harness: Harness) -> None:
    recs, ids = harness.records(3)
    harness.stub.claim_codes[ids[1]] = [ClaimResult.BUSY, ClaimResult.BUSY, ClaimResult.DUPLICATE]
    harness.pipe.read_ahead(recs)
    batch = harness.pipe.next_batch()
    assert batch is not None
    harness.pipe.handle(batch)  # BUSY: its done marks land now, the waits run (Step 7)
    assert harness.handled == [ids[0], ids[2]]
    assert batch.stage is BatchStage.COMMITTED
    stats = harness.batches.stats
    assert (stats.busy_waits, stats.duplicates, stats.busy_skipped) == (2, 1, 0)
    # Each wait claims the BUSY one again under a new token, and marks that pass done.
    retry_claims = [(t, i) for trip in harness.stub.trips[2:] for s, t, i in trip if s == "dedup_claim"]
    assert [i for _, i in retry_claims] == [[ids[1]], [ids[1]]]
    assert len({t for t, _ in retry_claims}) == 2


def test_a_failed_handler_lets_its_claim_go_and_retries_under_a_new_token() -> None:
    attempts: dict[str, int] = {}

    def flaky(ctx: HandlerContext) -> None:
        attempts[ctx.message_id] = attempts.get(ctx.message_id, 0) + 1
        if attempts[ctx.message_id] == 1 and ctx.offset == 1:
            raise ValueError("first attempt fails")

    h = Harness(flaky)
    try:
        batch = h.poll(3)
        assert batch is not None
        assert batch.stage is BatchStage.COMMITTED
        trips = h.stub.trips
        # The first done marks settle all three claims of the pass: two handled, one let go.
        first_done = [(t, i) for s, t, i in trips[1] if s == "dedup_done"]
        assert len(first_done) == 1
        assert len(first_done[0][1]) == 3
        retry = [(s, t, i) for trip in trips[2:] for s, t, i in trip]
        assert [s for s, _, _ in retry] == ["dedup_claim", "dedup_done"]
        assert retry[0][1] != first_done[0][0]  # a new token
        assert sorted(attempts.values()) == [1, 1, 2]
        assert h.batches.stats.handled == 3
        assert h.batches.stats.retries == 1
    finally:
        h.close()


def test_a_refused_effect_is_claimed_and_handled_again() -> None:
    handled: list[str] = []

    def with_effects(ctx: HandlerContext) -> None:
        ctx.tx.incr(ctx.key_for("n"))  # a Redis-transactional handler: its done reads claims
        handled.append(ctx.message_id)

    h = Harness(with_effects)
    try:
        recs, ids = h.records(2)
        h.stub.done_codes[ids[0]] = [DoneResult.EFFECT_ERROR]
        h.pipe.read_ahead(recs)
        batch = h.pipe.next_batch()
        assert batch is not None
        h.pipe.handle(batch)
        h.pipe.land_all()
        assert handled.count(ids[0]) == 2
        assert handled.count(ids[1]) == 1
        assert h.batches.stats.handled == 2
        assert batch.stage is BatchStage.COMMITTED
    finally:
        h.close()


def test_a_landing_that_failed_leaves_every_batch_to_rewind(harness: Harness) -> None:
    supply = [harness.records(2)[0] for _ in range(10)]
    for _ in range(3):
        harness.poll(0, supply=supply)
    harness.stub.fail_next_landing = True  # the next round trip fails when it lands
    def polls_until_it_lands() -> None:
        for _ in range(FLIGHTS_OUT + 1):
            harness.poll(0, supply=supply)

    with pytest.raises(StoreError):
        polls_until_it_lands()
    held = harness.pipe.held()
    committed: dict[Any, int] = {}
    for ends in harness.commits:
        committed.update(ends)
    assert held  # what a rewind re-reads
    harness.pipe.abandon()
    assert harness.pipe.idle
    assert all(b.stage is BatchStage.DROPPED for b in held)
    # Nothing held was committed: the rewind re-reads from the first offset held.
    assert committed.get(("t", 0), 0) <= min(m.offset() for b in held for m in b.msgs)


def test_dropped_partitions_give_back_whole_batches_and_let_go_the_rest(harness: Harness) -> None:
    harness.pipe.read_ahead([Record(0, CODEC.encode(envelope()), partition=0),
                             Record(0, CODEC.encode(envelope()), partition=1)])
    harness.pipe.read_ahead([Record(1, CODEC.encode(envelope()), partition=1)])
    first = harness.pipe.next_batch()
    assert first is not None
    harness.pipe.land_all()
    dropped = harness.pipe.drop({("t", 1)})
    # The batch with records of partition 0 keeps them: its done lets the dropped claim go;
    # the batch holding only partition 1 is dropped whole, for the caller to give back.
    assert [len(b.claimed) for b in dropped] == [1]
    assert [(item.partition, len(first.claimed)) for item in first.items] == [(0, 2)]
    harness.pipe.handle(first)
    harness.pipe.land_all()
    done = [i for trip in harness.stub.trips for s, _, i in trip if s == "dedup_done"]
    assert [len(ids) for ids in done] == [2]  # both claims of the pass settled


def test_a_copy_held_by_a_pass_of_ours_is_a_duplicate_at_once(harness: Harness) -> None:
    recs, ids = harness.records(3)
    harness.stub.claim_codes[ids[2]] = [ClaimResult.BUSY]
    harness.stub.busy_held_by_self = True  # e.g. the first copy of the id in this very batch
    harness.pipe.read_ahead(recs)
    batch = harness.pipe.next_batch()
    assert batch is not None
    harness.pipe.handle(batch)
    stats = harness.batches.stats
    assert (stats.duplicates, stats.busy_waits) == (1, 0)
    assert len(harness.stub.trips) == 2  # no retry round: nothing waited on ourselves
    assert harness.handled == ids[:2]


def test_a_message_expired_while_it_waited_is_not_handled(harness: Harness) -> None:
    recs, ids = harness.records(2)
    late = envelope(b"late", ttl_ms=150)
    recs.append(Record(harness.offset, CODEC.encode(late)))
    harness.pipe.read_ahead(recs)  # decoded in time: claimed
    batch = harness.pipe.next_batch()
    assert batch is not None
    assert [item.envelope.id for item in batch.items] == [*ids, late.id]
    time.sleep(0.2)  # it waits behind other batches past its expiry
    harness.pipe.handle(batch)
    harness.pipe.land_all()
    assert harness.handled == ids
    assert harness.batches.stats.expired == 1
    # Its claim is let go by the batch's done marks, with the handled ones.
    done = [i for trip in harness.stub.trips for s, _, i in trip if s == "dedup_done"]
    assert [len(i) for i in done] == [3]


def test_trace_mode_stamps_every_batch_at_each_stage_in_order() -> None:
    # 12 batches of 3 through the overlapped timeline, then drained; the ring keeps the
    # last 25 messages committed: the oldest batch kept is cut to its newest message.
    harness = Harness(trace_messages=25)
    try:
        reads = [harness.records(3) for _ in range(12)]
        supply = [recs for recs, _ in reads]
        while harness.poll(0, supply=supply) is not None or supply:
            pass
        assert harness.pipe.idle
        assert isinstance(harness.pipe, TracedPipeline)
        records = harness.pipe.ring.records()
        assert [r.message_id for r in records] == [i for _, ids in reads for i in ids][-25:]
        for rec in records:
            stamps = rec.stamps_ns()
            assert stamps[0] > 0
            assert list(stamps) == sorted(stamps), rec
        # Messages of a batch share its stamps; batches differ.
        assert records[1].stamps_ns() == records[3].stamps_ns()
        assert records[0].stamps_ns() != records[1].stamps_ns()
    finally:
        harness.close()
