"""AsyncGuardedConsumer against the real Kafka and Redis, each test on an event loop in debug
mode that fails when any step blocked the loop over 100 ms (tests/async_kit.py): async
handlers with effects and outputs, key order under concurrency, a timeout, cancellation of
run() (the batch in flight finished, or given back when cancelled twice) and ``async for``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest
import redis

from eoguard.consumer.aio import AsyncGuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import Envelope, now_ms
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import DedupStore
from eoguard.store.dedup_types import IdState
from eoguard.store.keys import KeySpace
from tests.async_kit import run
from tests.consumer_kit import DEFAULT_SCOPE, read_all
from tests.integration.test_async_producer import until

pytestmark = pytest.mark.integration

SCOPE = DEFAULT_SCOPE  # the async_consumer fixture's (tests/integration/conftest.py)


def counts(client: redis.Redis, key_prefix: str, envs: Sequence[Envelope]) -> dict[str, int]:
    """Each message's "count" effect (0: none)."""
    keys = KeySpace(prefix=key_prefix)
    return {e.id: int(client.get(keys.effect(SCOPE, e.id, f"count:{e.id}")) or 0) for e in envs}


def states(client: redis.Redis, key_prefix: str, envs: Sequence[Envelope]) -> set[IdState]:
    """The dedup states of ``envs`` (NEW: no claim key)."""
    store = DedupStore(client, scope=SCOPE, keys=KeySpace(prefix=key_prefix))
    found = [store.check(e.id) for e in envs]
    return {IdState.NEW if f is None else f.id_state(now_ms()) for f in found}


async def count_effect(ctx: HandlerContext) -> None:
    ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))


async def run_until(consumer: AsyncGuardedConsumer, done: Callable[[], bool]) -> None:
    """``consumer.run()`` as a task until ``done()``; then cancelled and awaited."""
    task = asyncio.ensure_future(consumer.run())
    await until(lambda: done() or task.done())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_async_handlers_apply_effects_and_outputs_once_on_the_loop(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic, out = new_topic(2), new_topic(1, prefix="out")
    envs = [envelope(b"m%d" % i) for i in range(200)]
    produce(kafka_bootstrap, topic, envs)
    threads: set[int] = set()

    async def handle(ctx: HandlerContext) -> None:
        threads.add(threading.get_ident())
        await asyncio.sleep(0.001)  # "I/O"
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        ctx.output(out, ctx.payload, key=ctx.message_id)

    async def main() -> int:
        async with async_consumer(topic, handle, concurrency=16) as consumer:
            await run_until(consumer, lambda: consumer.stats().handled >= len(envs))
            assert consumer.stats().handled == len(envs)
        return threading.get_ident()

    loop_thread = run(main())
    assert threads == {loop_thread}  # every handler ran on the loop
    assert set(counts(redis_client, key_prefix, envs).values()) == {1}
    outputs = read_all(kafka_bootstrap, out, len(envs), timeout_s=10)
    assert sorted(m.key().decode() for m in outputs) == sorted(e.id for e in envs)


@pytest.mark.parametrize("keep_key_order", [True, False])
def test_concurrent_handlers_keep_each_keys_order_when_asked(
        async_consumer, new_topic, kafka_bootstrap, keep_key_order) -> None:
    # Six keys interleaved on one partition, 20 messages each; a key's later message sleeps
    # less than its earlier one, so two of one key running at once end out of order. With
    # keep_key_order a key's handlers run one after another, in offset order; without it
    # (the control) they overlap, so the check below can fail.
    topic = new_topic(1)
    per_key, keys = 20, [b"k%d" % k for k in range(6)]
    envs = [envelope(b"%d" % seq) for seq in range(per_key) for _ in keys]
    produce(kafka_bootstrap, topic, envs, keys=keys * per_key, partition=0)
    events: list[tuple[bytes, str, int]] = []
    running = [0, 0]  # now, most at once

    async def handle(ctx: HandlerContext) -> None:
        seq = int(ctx.payload)
        assert ctx.key is not None
        events.append((ctx.key, "start", seq))
        running[0] += 1
        running[1] = max(running)
        await asyncio.sleep((per_key - seq) * 0.0005)
        running[0] -= 1
        events.append((ctx.key, "end", seq))

    async def main() -> None:
        async with async_consumer(topic, handle, concurrency=8, keep_key_order=keep_key_order,
                         batch_size=500) as consumer:
            await run_until(consumer, lambda: consumer.stats().handled >= len(envs))

    run(main())
    in_order = [(kind, seq) for seq in range(per_key) for kind in ("start", "end")]
    out_of_order = [k for k in keys if [(kind, s) for key, kind, s in events if key == k]
                    != in_order]
    assert running[1] > 1  # handlers did run at once
    if keep_key_order:
        assert out_of_order == []
    else:
        assert out_of_order != []


def test_a_handler_past_its_timeout_is_cancelled_and_its_message_retried(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(5)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    attempts: dict[str, list[int]] = {}
    cancelled: list[str] = []

    async def handle(ctx: HandlerContext) -> None:
        attempts.setdefault(ctx.message_id, []).append(ctx.attempt)
        # Queued; applied only by a successful attempt.
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        if ctx.message_id == envs[2].id and ctx.attempt == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(ctx.message_id)
                raise

    async def main() -> None:
        async with async_consumer(topic, handle, concurrency=4, handler_timeout_s=0.3) as consumer:
            await run_until(consumer, lambda: consumer.stats().handled >= len(envs))
            assert consumer.stats().retries == 1

    run(main())
    assert cancelled == [envs[2].id]
    assert attempts[envs[2].id] == [1, 2]
    assert set(counts(redis_client, key_prefix, envs).values()) == {1}


def test_cancelling_run_finishes_the_batch_in_flight_and_gives_back_the_rest(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(400)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    gate = asyncio.Event()
    entered = asyncio.Event()
    handled: list[str] = []

    async def handle(ctx: HandlerContext) -> None:
        if len(handled) == 30:  # mid-batch: run() is cancelled while this one waits
            entered.set()
            await gate.wait()
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        handled.append(ctx.message_id)

    async def main() -> None:
        async with async_consumer(topic, handle, batch_size=50) as consumer:
            task = asyncio.ensure_future(consumer.run())
            await asyncio.wait_for(entered.wait(), 30)
            task.cancel()
            await asyncio.sleep(0.2)
            assert not task.done()  # the batch in flight is finished first
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main())
    done = {mid for mid, n in counts(redis_client, key_prefix, envs).items() if n == 1}
    assert done == set(handled)  # every message handled has its done mark
    assert 30 < len(handled) < len(envs)  # the waiting handler finished, the rest did not run
    left = states(redis_client, key_prefix, [e for e in envs if e.id not in done])
    assert IdState.FREE in left  # batches read ahead were claimed, then given back ...
    assert IdState.IN_PROGRESS not in left  # ... every one of them


def test_cancelling_run_twice_cancels_the_handlers_and_gives_their_batch_back(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(100)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    group = f"g-twice-{key_prefix}"
    stuck = asyncio.Event()

    async def hang_on_the_tenth(ctx: HandlerContext) -> None:
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        if ctx.message_id == envs[10].id:
            stuck.set()
            await asyncio.sleep(3600)

    async def first() -> None:
        async with async_consumer(topic, hang_on_the_tenth, group=group, concurrency=4,
                         lease_s=60) as consumer:
            task = asyncio.ensure_future(consumer.run())
            await asyncio.wait_for(stuck.wait(), 30)
            task.cancel()
            await asyncio.sleep(0.1)
            task.cancel()  # again: the stuck handler is cancelled, its batch given back
            with pytest.raises(asyncio.CancelledError):
                await task

    run(first())
    assert counts(redis_client, key_prefix, envs)[envs[10].id] == 0
    assert IdState.IN_PROGRESS not in states(redis_client, key_prefix, envs)  # lease_s=60

    read_on(async_consumer, topic, group, redis_client, key_prefix, envs)


def read_on(async_consumer: Callable[..., AsyncGuardedConsumer], topic: str, group: str,
            client: redis.Redis, key_prefix: str, envs: Sequence[Envelope]) -> None:
    """The group reads on with a new consumer: every message's effect is then there once."""
    missing = sum(1 for n in counts(client, key_prefix, envs).values() if n == 0)

    async def main() -> None:
        async with async_consumer(topic, count_effect, group=group) as consumer:
            await run_until(consumer, lambda: consumer.stats().handled >= missing)

    run(main())
    assert set(counts(client, key_prefix, envs).values()) == {1}


def test_async_for_hands_messages_over_one_at_a_time_and_gives_back_the_one_in_hand(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(60)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    group = f"g-iter-{key_prefix}"
    got: list[str] = []

    async def first() -> None:
        async with async_consumer(topic, group=group, batch_size=20) as consumer:
            async for ctx in consumer:
                got.append(ctx.message_id)
                ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
                await asyncio.sleep(0)
                if len(got) == 30:  # mid-batch: the batch in hand goes back, unhandled
                    break

    run(first())
    assert got == [e.id for e in envs[:30]]  # in order, one at a time
    effects = counts(redis_client, key_prefix, envs)
    done = [e.id for e in envs if effects[e.id]]
    assert done == got[:len(done)]  # the batches handled before the one in hand
    assert envs[29].id not in done  # in hand at the break: given back, unhandled
    assert set(effects.values()) <= {0, 1}
    assert IdState.IN_PROGRESS not in states(redis_client, key_prefix, envs)
    read_on(async_consumer, topic, group, redis_client, key_prefix, envs)
