"""Light mode (a consumer keeping up): a batch's done marks stay in flight until the next
poll, while the claims of the batch read then go out (eoguard/consumer/pipeline.py). The
interleavings of that window, end to end on real Kafka and Redis: a copy of a message of the
batch whose done marks are in flight, with Redis running those done marks first or the next
claims first (a delayed send stands for a slow connection); its effects refused by the done
marks; a failing handler in the next batch; a rebalance, its hook landing the done marks or
failing to (Redis stopped); close(); the done marks lost with their connections, or held up
by a stopped Redis; a slot moving between the next claims and the done marks (cluster).
Each test checks every effect applied once, nothing lost and every offset committed."""

from __future__ import annotations

import inspect
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace
from tests.consumer_kit import claims_by_script, committed_total, drain
from tests.migration_kit import Phase, free_scope, slot_move, slot_of

pytestmark = pytest.mark.integration


class Counting:
    """A Redis-transactional handler: one INCR per message id, and every call seen."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.keys: dict[str, str] = {}

    def __call__(self, ctx: HandlerContext) -> None:
        self.calls.append(ctx.message_id)
        self.keys[ctx.message_id] = ctx.key_for(f"count:{ctx.message_id}")
        ctx.tx.incr(self.keys[ctx.message_id])

    def effects(self, client: Any) -> Counter[str]:
        return Counter({i: int(client.get(key) or 0) for i, key in self.keys.items()})


def hold_done_marks(consumer: GuardedConsumer, before_send: Callable[[], None] | None = None,
                    *, defer: bool = True) -> list[str]:
    """Delay the sending of every round trip carrying done marks until its replies are read
    (what a slow connection does), so Redis runs the claims sent after it first; with
    ``defer=False`` only call ``before_send`` right before each is sent. Returns the names of
    the functions that landed them (to see which path did)."""
    pipe, batches = consumer._pipe, consumer._batch
    done_calls: set[int] = set()
    real_done_call, real_send = batches.done_call, pipe._send
    landed_by: list[str] = []

    def done_call(batch: Any, ok: Any) -> Any:
        prepared = real_done_call(batch, ok)
        done_calls.add(id(prepared))
        return prepared

    def send(prepared: list[Any]) -> Callable[[], list[Any]]:
        if not any(id(p) in done_calls for p in prepared):
            return real_send(prepared)
        if not defer:
            if before_send is not None:
                before_send()
            return real_send(prepared)

        def replies() -> list[Any]:
            landed_by.extend(f.function for f in inspect.stack()[1:8])
            if before_send is not None:
                before_send()
            return real_send(prepared)()
        return replies

    batches.done_call = done_call  # type: ignore[method-assign]
    pipe._send = send
    return landed_by


def wait_for_records_while_marking(consumer: GuardedConsumer) -> None:
    """With only done marks in flight, the poll waits up to 2 s for a record (not 10 ms): the next
    batch is read, and its claims sent, while those done marks are in flight."""
    real = consumer._poll_wait

    def poll_wait(pipe: Any) -> float:
        return 2.0 if pipe.marking_only else real(pipe)
    consumer._poll_wait = poll_wait  # type: ignore[method-assign]


def done_marks_in_flight(consumer: GuardedConsumer) -> bool:
    """Nothing is left to handle, and done marks are in flight (not landed yet)."""
    return consumer._pipe.marking_only and not consumer._pipe.idle


def poll_until(consumer: GuardedConsumer, done: Callable[[], bool], limit: int = 200) -> None:
    for _ in range(limit):
        if done():
            return
        consumer.poll_once()
    raise AssertionError("not reached")


def first_then_copy(consumer: GuardedConsumer, counting: Counting, bootstrap: str, topic: str,
                    tag: bytes) -> list[Any]:
    """Three messages read and handled, their done marks in flight; then a copy of the second
    and a new one produced. Returns the four messages."""
    first = [envelope(tag + b"%d" % i) for i in range(3)]
    later = envelope(tag + b"-later")
    produce(bootstrap, topic, first, partition=0)
    poll_until(consumer, lambda: len(counting.calls) == 3)
    assert done_marks_in_flight(consumer)
    produce(bootstrap, topic, [first[1].with_attempt(2), later], partition=0)
    return [*first, later]


def committed_once_closed(consumer: GuardedConsumer, bootstrap: str, topic: str) -> int:
    """The offsets committed on ``topic``'s one partition once ``consumer`` is closed."""
    consumer.close()  # its revocation commits what is stored, and waits for it
    committed, end = committed_total(bootstrap, consumer.config.kafka["group.id"], topic, 1)
    assert committed == end
    return committed


@pytest.mark.cluster
@pytest.mark.parametrize(("claims_first", "script"), [(False, False), (True, True), (True, False)],
                         ids=["done-first", "claims-first", "claims-first-fresh"])
def test_a_copy_read_while_the_done_marks_are_in_flight_is_handled_once(
        make, new_topic, kafka_bootstrap, redis_client: redis.Redis, claims_first: bool,
        script: bool, monkeypatch) -> None:
    # "claims-first": the copy's claim is answered by the script while the done marks are held
    # in flight, so it is BUSY; a fresh pass (the default) answers a claim that found a key
    # once its round trip lands, the held done marks run by then: DUPLICATE at once.
    if script:
        claims_by_script(monkeypatch)
    topic = new_topic(1)
    counting = Counting()
    consumer = make([topic], counting, batch_size=100)
    wait_for_records_while_marking(consumer)
    held = hold_done_marks(consumer) if claims_first else []
    envs = first_then_copy(consumer, counting, kafka_bootstrap, topic, b"a")
    poll_until(consumer, lambda: len(counting.calls) >= 4 and consumer._pipe.idle)
    stats = consumer.stats()
    print(f"calls={Counter(counting.calls)} duplicates={stats.duplicates} "
          f"busy_waits={stats.busy_waits} landed_by={set(held) & {'next_batch', 'handle'}}")
    assert Counter(counting.calls) == Counter(e.id for e in envs)
    assert counting.effects(redis_client) == Counter({e.id: 1 for e in envs})
    assert stats.duplicates == 1
    assert stats.busy_skipped == 0
    if script:
        assert stats.busy_waits >= 1  # the copy found the first batch's claim held
    assert committed_once_closed(consumer, kafka_bootstrap, topic) == 5


def test_a_rebalance_with_the_done_marks_in_flight(make, new_topic, kafka_bootstrap,
                                                   redis_client: redis.Redis) -> None:
    topic = new_topic(2)
    group = "g-light-rebalance-" + topic
    envs = [envelope(b"r%d" % i) for i in range(6)]
    counting = Counting()
    a = make([topic], counting, batch_size=100, group=group)
    landed_by = hold_done_marks(a)
    produce(kafka_bootstrap, topic, envs[:3], partition=0)
    produce(kafka_bootstrap, topic, envs[3:], partition=1)
    poll_until(a, lambda: len(counting.calls) >= 1 and done_marks_in_flight(a))
    b = make([topic], counting, batch_size=100, group=group)
    for _ in range(5):
        b.poll_once()  # joins: a's next consume serves the revocation
    drain([a, b], lambda: len(counting.calls) >= 6 and a._pipe.idle and b._pipe.idle,
          settle_polls=5)
    print(f"calls={Counter(counting.calls)} landed_by={landed_by[:8]}")
    assert "_on_revoke" in landed_by  # the hook landed the done marks in flight
    assert Counter(counting.calls) == Counter(e.id for e in envs)
    assert counting.effects(redis_client) == Counter({e.id: 1 for e in envs})
    a.close()
    b.close()
    assert committed_total(kafka_bootstrap, group, topic, 2) == (6, 6)


def test_close_with_the_done_marks_in_flight_commits_them(make, new_topic, kafka_bootstrap,
                                                         redis_client: redis.Redis) -> None:
    topic = new_topic(1)
    group = "g-light-close-" + topic
    envs = [envelope(b"c%d" % i) for i in range(3)]
    counting = Counting()
    consumer = make([topic], counting, batch_size=100, group=group)
    produce(kafka_bootstrap, topic, envs, partition=0)
    poll_until(consumer, lambda: len(counting.calls) == 3)
    assert done_marks_in_flight(consumer)
    consumer.close()
    assert committed_total(kafka_bootstrap, group, topic, 1) == (3, 3)
    again = Counting()
    second = make([topic], again, batch_size=100, group=group)
    for _ in range(5):
        second.poll_once()
    assert again.calls == []
    assert second.stats().redelivered == 0


def test_done_marks_lost_with_their_connection_then_the_next_claims(
        make, new_topic, kafka_bootstrap, private_redis) -> None:
    # The done marks are held by a write pause; their connections are killed: they never
    # ran. The next poll sends the next claims, then finds them lost: both batches re-read.
    client = redis.Redis.from_url(private_redis.address)
    admin = redis.Redis.from_url(private_redis.address)
    topic = new_topic(1)
    first, second = [envelope(b"k%d" % i) for i in range(3)], [envelope(b"l%d" % i) for i in range(3)]
    counting = Counting()
    consumer = make([topic], counting, batch_size=100, redis=client)
    wait_for_records_while_marking(consumer)
    pause = {"on": True}

    def pause_writes() -> None:
        if pause["on"]:
            admin.execute_command("CLIENT", "PAUSE", "20000", "WRITE")
            pause["on"] = False
    hold_done_marks(consumer, before_send=pause_writes, defer=False)
    produce(kafka_bootstrap, topic, first, partition=0)
    poll_until(consumer, lambda: len(counting.calls) == 3)
    assert done_marks_in_flight(consumer)
    killed = admin.client_kill_filter(_type="normal", skipme=True)
    admin.execute_command("CLIENT", "UNPAUSE")
    produce(kafka_bootstrap, topic, second, partition=0)
    drain([consumer], lambda: len(set(counting.calls)) == 6 and consumer._pipe.idle,
          settle_polls=5)
    stats = consumer.stats()
    print(f"killed={killed} calls={Counter(counting.calls)} outages={stats.store_outages} "
          f"redelivered={stats.redelivered}")
    assert killed > 0
    assert stats.store_outages >= 1
    assert counting.effects(client) == Counter({e.id: 1 for e in [*first, *second]})
    assert committed_once_closed(consumer, kafka_bootstrap, topic) == 6


@pytest.mark.cluster(only=True)
@pytest.mark.parametrize("moved", ["all", "claim"])
def test_a_slot_moving_between_the_next_claims_and_the_done_marks(
        make, new_topic, kafka_bootstrap, redis_client, redis_url: str, key_prefix: str,
        moved: str) -> None:
    # The copy's claims run on the source (BUSY); then the slot starts moving, and the done
    # marks go out: redirected (every key moved: ASK) or refused (the claim key alone moved:
    # TRYAGAIN, an outage: both batches re-read) until the move is finished.
    keys = KeySpace(prefix=key_prefix, shards=1)
    scope = free_scope(redis_url, keys)
    topic = new_topic(1)
    first = [envelope(b"s%d" % i) for i in range(3)]
    copy, later = first[1].with_attempt(2), envelope(b"later")
    counting = Counting()
    consumer = make([topic], counting, batch_size=100, scope=scope, shards=1)
    prefix = keys.dedup_prefixes(scope)[0]
    with slot_move(redis_url, slot_of(keys, scope)) as move:
        def start_moving() -> None:
            if move.phase is not Phase.HOME:
                return
            move.begin()
            on_source = move._keys_on(move.source)
            move.migrate(*(on_source if moved == "all" else [prefix + first[1].id]))
        wait_for_records_while_marking(consumer)
        hold_done_marks(consumer, before_send=start_moving)
        produce(kafka_bootstrap, topic, first, partition=0)
        poll_until(consumer, lambda: len(counting.calls) == 3)
        produce(kafka_bootstrap, topic, [copy, later], partition=0)
        for _ in range(4):
            consumer.poll_once()
        move.finish()
        drain([consumer], lambda: len(set(counting.calls)) >= 4 and consumer._pipe.idle,
              settle_polls=5)
        stats = consumer.stats()
        print(f"calls={Counter(counting.calls)} outages={stats.store_outages} "
              f"duplicates={stats.duplicates} busy_waits={stats.busy_waits} "
              f"redelivered={stats.redelivered}")
        assert counting.effects(redis_client) == Counter({e.id: 1 for e in [*first, later]})
        consumer.close()
    assert committed_total(kafka_bootstrap, consumer.config.kafka["group.id"], topic, 1) == (5, 5)


@pytest.mark.parametrize("claims_first", [False, True], ids=["done-first", "claims-first"])
def test_effects_refused_at_the_done_mark_with_a_copy_read_meanwhile(
        make, new_topic, kafka_bootstrap, redis_client: redis.Redis, claims_first: bool) -> None:
    # The first batch's done marks refuse one message's effects (its claim deleted, claimed
    # again later); a copy of it is read, and claimed, while those done marks are in flight.
    topic = new_topic(1)
    counting = Counting()
    refused: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        counting(ctx)
        if len(counting.calls) == 2 and not refused:  # the second message, once
            bad = ctx.key_for("not-a-number")
            redis_client.set(bad, "x")
            refused.append(bad)
            ctx.tx.incr(bad)  # refused by the done mark: nothing of this handling applied
    consumer = make([topic], handler, batch_size=100)
    wait_for_records_while_marking(consumer)
    if claims_first:
        hold_done_marks(consumer)
    envs = first_then_copy(consumer, counting, kafka_bootstrap, topic, b"e")
    poll_until(consumer, lambda: len(set(counting.calls)) >= 4 and consumer._pipe.idle)
    for _ in range(3):
        consumer.poll_once()
    stats = consumer.stats()
    print(f"calls={sorted(Counter(counting.calls).values())} handled={stats.handled} "
          f"duplicates={stats.duplicates} retries={stats.retries} busy_waits={stats.busy_waits} "
          f"dead={stats.dead_lettered}")
    assert counting.effects(redis_client) == Counter({e.id: 1 for e in envs})
    assert stats.dead_lettered == 0
    assert committed_once_closed(consumer, kafka_bootstrap, topic) == 5


def test_a_failing_handler_in_the_batch_read_while_the_done_marks_are_in_flight(
        make, new_topic, kafka_bootstrap, redis_client: redis.Redis) -> None:
    # The next batch (a copy and a new message that fails twice) lands the done marks in
    # flight, then its own at once to retry.
    topic = new_topic(1)
    counting = Counting()
    failures: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        if len(counting.calls) == 3 and len(failures) < 2:
            failures.append(ctx.message_id)
            raise RuntimeError("boom")
        counting(ctx)
    consumer = make([topic], handler, batch_size=100)
    wait_for_records_while_marking(consumer)
    envs = first_then_copy(consumer, counting, kafka_bootstrap, topic, b"h")
    poll_until(consumer, lambda: len(set(counting.calls)) >= 4 and consumer._pipe.idle)
    stats = consumer.stats()
    print(f"calls={sorted(Counter(counting.calls).values())} retries={stats.retries}")
    assert failures == [envs[3].id] * 2
    assert counting.effects(redis_client) == Counter({e.id: 1 for e in envs})
    assert stats.retries == 2
    assert stats.duplicates == 1
    assert committed_once_closed(consumer, kafka_bootstrap, topic) == 5


def test_redis_stopped_while_the_done_marks_and_the_next_claims_are_in_flight(
        make, new_topic, kafka_bootstrap, private_redis) -> None:
    # The next batch's claims are sent and answered; Redis is stopped (SIGSTOP) as the done
    # marks before them go out, and continued 3 s later: the poll times out, rewinds, and
    # Redis then runs what was sent to it.
    client = redis.Redis.from_url(private_redis.address, socket_timeout=1.0)
    topic = new_topic(1)
    first, second = [envelope(b"p%d" % i) for i in range(3)], [envelope(b"q%d" % i) for i in range(3)]
    copy = first[2].with_attempt(2)
    counting = Counting()
    consumer = make([topic], counting, batch_size=100, redis=client)
    pid = private_redis.pid()
    continued: list[threading.Timer] = []

    def stop_redis() -> None:
        if not continued:
            os.kill(pid, signal.SIGSTOP)
            continued.append(threading.Timer(3.0, os.kill, (pid, signal.SIGCONT)))
            continued[0].start()
    wait_for_records_while_marking(consumer)
    hold_done_marks(consumer, before_send=stop_redis)
    try:
        produce(kafka_bootstrap, topic, first, partition=0)
        poll_until(consumer, lambda: len(counting.calls) == 3)
        produce(kafka_bootstrap, topic, [*second, copy], partition=0)
        drain([consumer], lambda: len(set(counting.calls)) == 6 and consumer._pipe.idle,
              settle_polls=5)
    finally:
        for timer in continued:
            timer.join()
        os.kill(pid, signal.SIGCONT)
    stats = consumer.stats()
    print(f"calls={sorted(Counter(counting.calls).values())} outages={stats.store_outages} "
          f"redelivered={stats.redelivered} duplicates={stats.duplicates} "
          f"busy_waits={stats.busy_waits} skipped={stats.busy_skipped}")
    assert continued
    assert stats.store_outages >= 1
    assert counting.effects(client) == Counter({e.id: 1 for e in [*first, *second]})
    assert stats.busy_skipped == 0
    assert committed_once_closed(consumer, kafka_bootstrap, topic) == 7


def test_a_rebalance_whose_hook_cannot_land_the_done_marks(make, new_topic, kafka_bootstrap,
                                                          private_redis) -> None:
    # Redis stops (SIGSTOP, continued 3 s later) as the revocation hook lands the done marks
    # in flight: the hook forgets the revoked records, the next consume rewinds the rest.
    topic = new_topic(2)
    group = "g-light-forget-" + topic
    envs = [envelope(b"f%d" % i) for i in range(6)]
    counting = Counting()
    pid = private_redis.pid()
    continued: list[threading.Timer] = []

    def stop_redis_in_the_hook() -> None:
        if not continued and any(f.function == "_on_revoke" for f in inspect.stack()):
            os.kill(pid, signal.SIGSTOP)
            continued.append(threading.Timer(3.0, os.kill, (pid, signal.SIGCONT)))
            continued[0].start()

    def client() -> redis.Redis:
        return redis.Redis.from_url(private_redis.address, socket_timeout=1.0)
    a = make([topic], counting, batch_size=100, group=group, redis=client())
    hold_done_marks(a, before_send=stop_redis_in_the_hook)
    produce(kafka_bootstrap, topic, envs[:3], partition=0)
    produce(kafka_bootstrap, topic, envs[3:], partition=1)
    try:
        poll_until(a, lambda: len(counting.calls) >= 1 and done_marks_in_flight(a))
        b = make([topic], counting, batch_size=100, group=group, redis=client())
        for _ in range(5):
            b.poll_once()
        drain([a, b], lambda: len(set(counting.calls)) >= 6 and a._pipe.idle and b._pipe.idle,
              settle_polls=5)
    finally:
        for timer in continued:
            timer.join()
        os.kill(pid, signal.SIGCONT)
    print(f"calls={sorted(Counter(counting.calls).values())} "
          f"outages={a.stats().store_outages} redelivered={a.stats().redelivered}+"
          f"{b.stats().redelivered}")
    assert continued
    assert counting.effects(client()) == Counter({e.id: 1 for e in envs})
    a.close()
    b.close()
    assert committed_total(kafka_bootstrap, group, topic, 2) == (6, 6)
