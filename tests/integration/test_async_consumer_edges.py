"""AsyncGuardedConsumer at its edges, against the real Kafka and Redis: run() on another loop
than start()'s, a handler raising CancelledError of its own, async for's timeout and a second
async for refused, the key order across a failed attempt (tests/integration/
test_async_consumer.py has the main cases and the fixture)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from eoguard.consumer.handler import HandlerContext
from eoguard.errors import StateError
from eoguard.stack.feed import envelope, produce
from tests.async_kit import run
from tests.integration.test_async_consumer import (
    count_effect,
    counts,
    run_until,
)

pytestmark = pytest.mark.integration


def test_run_on_another_loop_than_starts_raises(async_consumer, new_topic, kafka_bootstrap,
                                                 redis_client, key_prefix) -> None:
    # Its batches would go to start()'s loop, closed or run by nobody: run() returned at
    # once, nothing handled, no error.
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(5)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    consumer = async_consumer(topic, count_effect)
    run(consumer.start())

    async def on_another_loop() -> None:
        try:
            with pytest.raises(StateError, match="another event loop"):
                await consumer.run()
        finally:
            await consumer.close()

    run(on_another_loop())
    assert set(counts(redis_client, key_prefix, envs).values()) == {0}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="needs Task.cancelling (Python 3.11)")
@pytest.mark.parametrize(("concurrency", "timeout_s"), [(1, None), (4, None), (1, 5.0),
                                                        (4, 5.0)])
def test_a_handler_raising_cancelled_of_its_own_fails_its_attempt_only(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix, concurrency,
        timeout_s) -> None:
    # The handler awaits a future another component cancelled: its attempt fails and is
    # retried. Before: its batch was given back and run() returned, the consumer stopped
    # without anybody asking.
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(20)]
    produce(kafka_bootstrap, topic, envs, partition=0)

    async def handle(ctx: HandlerContext) -> None:
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        if ctx.message_id == envs[5].id and ctx.attempt == 1:
            shared = asyncio.get_running_loop().create_future()
            shared.cancel()
            await shared

    async def main() -> None:
        async with async_consumer(topic, handle, concurrency=concurrency,
                         handler_timeout_s=timeout_s) as consumer:
            await run_until(consumer, lambda: consumer.stats().handled >= len(envs))
            assert consumer.stats().retries == 1

    run(main())
    assert set(counts(redis_client, key_prefix, envs).values()) == {1}


def test_async_for_times_a_message_from_when_the_body_takes_it(async_consumer, new_topic, kafka_bootstrap,
                                                              redis_client, key_prefix) -> None:
    # The body overruns handler_timeout_s on m3 (its attempt fails, retried). Before, the
    # timeout of m4, waiting in the hand-over queue, ran meanwhile: m4's attempt failed too,
    # and the body was then handed m4 anyway, its effects dropped (then m4 again, retried).
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(8)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    index = {e.id: i for i, e in enumerate(envs)}
    seen: list[tuple[int, int]] = []

    async def main() -> None:
        async with async_consumer(topic, handler_timeout_s=0.2) as consumer:
            async for ctx in consumer:
                seen.append((index[ctx.message_id], ctx.attempt))
                ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
                if seen[-1] == (3, 1):
                    await asyncio.sleep(1.0)  # past the timeout: this attempt fails
                if (3, 2) in seen and len({i for i, _ in seen}) == len(envs):
                    break

    run(main())
    assert sorted(seen) == sorted([(i, 1) for i in range(8)] + [(3, 2)])
    effects = counts(redis_client, key_prefix, envs)
    assert [effects[e.id] for i, e in enumerate(envs) if i != 3] == [1] * 7


def test_a_second_async_for_refused_leaves_the_first_one_going(async_consumer, new_topic,
                                                               kafka_bootstrap) -> None:
    # Before, the refused second loop had taken the hand-over queue: the first one got
    # nothing more and waited forever (here: until wait_for's guard).
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(20)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    got: list[str] = []

    async def main() -> None:
        async with async_consumer(topic) as consumer:
            async def first() -> None:
                async for ctx in consumer:
                    got.append(ctx.message_id)
                    if len(got) == 5:
                        with pytest.raises(StateError, match="runs already"):
                            async for _ in consumer:
                                pass
                    if len(got) == len(envs):
                        break
            await asyncio.wait_for(first(), 30)

    run(main())
    assert got == [e.id for e in envs]


def test_keep_key_order_holds_across_a_failed_attempt(async_consumer, new_topic,
                                                      kafka_bootstrap) -> None:
    topic = new_topic(1)
    envs = [envelope(b"%d" % i) for i in range(6)]
    produce(kafka_bootstrap, topic, envs, key=b"K", partition=0)
    succeeded: list[int] = []

    async def handle(ctx: HandlerContext) -> None:
        seq = int(ctx.payload)
        if seq == 1 and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")
        succeeded.append(seq)

    async def main() -> None:
        async with async_consumer(topic, handle, concurrency=4, keep_key_order=True) as consumer:
            await run_until(consumer, lambda: consumer.stats().handled >= len(envs))

    run(main())
    assert succeeded == list(range(6))  # before Deferred: [0, 2, 3, 4, 5, 1]


def test_a_key_held_back_by_a_poison_message_goes_on_once_it_is_dead_lettered(
        async_consumer, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    """Message 1 of key K always fails: 2-4 wait behind it, deferred without an attempt
    counted, and are handled (each on its first attempt, effects once) after 1 is
    dead-lettered past max_retries; key L's messages are never held back."""
    topic = new_topic(1)
    envs = [envelope(b"%d" % i) for i in range(5)]
    others = [envelope(b"%d" % i) for i in range(10, 13)]
    produce(kafka_bootstrap, topic, envs[:3], key=b"K", partition=0)
    produce(kafka_bootstrap, topic, others, key=b"L", partition=0)
    produce(kafka_bootstrap, topic, envs[3:], key=b"K", partition=0)
    succeeded: list[tuple[int, int]] = []

    async def handle(ctx: HandlerContext) -> None:
        seq = int(ctx.payload)
        if seq == 1:
            raise RuntimeError("poison")
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        succeeded.append((seq, ctx.attempt))

    async def main() -> tuple[int, int]:
        async with async_consumer(topic, handle, concurrency=4, keep_key_order=True, max_retries=2,
                        retry_backoff_s=0.01) as consumer:
            await run_until(consumer, lambda: consumer.stats().dead_lettered >= 1
                            and consumer.stats().handled >= 7)
            return consumer.stats().dead_lettered, consumer.stats().handled

    dead, handled = run(main())
    print(f"handled in order {succeeded}; dead-lettered {dead}")
    assert (dead, handled) == (1, 7)
    keyed = [seq for seq, _ in succeeded if seq < 10]
    assert keyed == [0, 2, 3, 4]
    assert all(attempt == 1 for seq, attempt in succeeded if seq != 0)
    assert set(counts(redis_client, key_prefix, [e for e in envs if e is not envs[1]]
                      ).values()) == {1}
