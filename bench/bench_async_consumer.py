"""Async consumer throughput against the local stack (a benchmark, not a test).

    python -m bench.bench_async_consumer [--messages 20000] [--io-messages 2000]
                                         [--io-ms 5] [--concurrency 64] [--batch 500]
                                         [--partitions 4] [--rounds 3]

Pre-produces ~200-byte envelopes once, then reads them on one event loop, each run in a
fresh group, timed from the first record until the last is handled:

  plain async loop, no-op     the baseline: confluent_kafka.aio.AIOConsumer, ``await
                              consume(batch)``, each envelope decoded with eoguard's codec
                              (the decode the guarded consumer does), a no-op ``async def``
                              handler awaited, an asynchronous commit per batch;
  AsyncGuardedConsumer, no-op the same handler under AsyncGuardedConsumer (claim, done,
                              commit), one at a time;

and over the first ``--io-messages`` records, with a handler that awaits ``--io-ms`` of
"I/O" (``asyncio.sleep``):

  plain async loop, I/O       the baseline: the loop above awaiting each handler in turn;
  AsyncGuardedConsumer, I/O x1     one handler at a time;
  AsyncGuardedConsumer, I/O xN     ``--concurrency`` at a time, key order kept (the records
                                   have 64 keys): where concurrency wins.

The guarded rows are timed from their first handler call, after the first claims landed (a
round trip, a few ms, with the next batches read meanwhile): a bias in their favour that only
shows at small sizes, so read the figures of the default sizes. Meanwhile a probe task records
the event loop's lag (bench_async's). Prints msg/s, each median's ratio to its baseline, and
the lag; ``python -m bench async`` runs this after the async producer's rows.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

from bench import table
from bench.bench_async import LagProbe, percentile
from bench.bench_consumer import eoguard_decode, forget, make_topic
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.aio import AsyncGuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack import LocalStack
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace

KEYS = 64
NOOP, IO = "no-op", "I/O"

Handler = Callable[[object], Awaitable[None]]


def io_handler(io_ms: float) -> Handler:
    async def handle(_: object) -> None:
        await asyncio.sleep(io_ms / 1000)
    return handle


async def noop(_: object) -> None:
    return None


async def plain_loop(bootstrap: str, topic: str, total: int, batch: int,
                     handler: Handler) -> float:
    """Seconds from the first record to the last handled, by AIOConsumer in a plain loop."""
    from confluent_kafka.aio import AIOConsumer  # noqa: PLC0415 - confluent-kafka >= 2.12

    consumer = AIOConsumer({"bootstrap.servers": bootstrap,
                            "group.id": f"b-{uuid.uuid4().hex[:8]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    await consumer.subscribe([topic])
    seen, started = 0, 0.0
    try:
        while seen < total:
            msgs = await consumer.consume(batch, 1.0)
            if msgs and not started:
                started = time.perf_counter()
            for msg in msgs:
                if msg.error() is not None:
                    continue
                await handler(eoguard_decode(msg.value()))
                seen += 1
                if seen == total:
                    break
            if msgs:
                await consumer.commit(asynchronous=True)
        return time.perf_counter() - started
    finally:
        await consumer.close()


async def guarded(bootstrap: str, redis_url: str, topic: str, total: int, batch: int,
                  handler: Handler, concurrency: int) -> float:
    """Seconds from the first record handled to the last, by AsyncGuardedConsumer."""
    keyspace = KeySpace(prefix=f"bench{uuid.uuid4().hex[:6]}")
    config = ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex[:8]}"},
        redis=RedisConfig(url=redis_url), scope=f"bench-{uuid.uuid4().hex[:6]}",
        topics=(topic,), batch_size=batch, keyspace=keyspace, ack_outbox=False)
    started = 0.0
    done = asyncio.get_running_loop().create_future()
    handled = 0

    async def handle(ctx: HandlerContext) -> None:
        nonlocal started, handled
        if not started:
            started = time.perf_counter()
        await handler(ctx.payload)
        handled += 1
        if handled >= total and not done.done():
            done.set_result(time.perf_counter())

    try:
        async with AsyncGuardedConsumer(config, handler=handle,
                                        concurrency=concurrency) as consumer:
            running = asyncio.ensure_future(consumer.run())
            ended = await done
            running.cancel()  # the last batch's done marks land as the run ends
            await asyncio.gather(running, return_exceptions=True)
        return ended - started
    finally:
        forget(redis_url, keyspace.pattern())


async def timed(coro: Awaitable[float]) -> tuple[float, list[float]]:
    probe = LagProbe()
    elapsed = await coro
    return elapsed, probe.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--io-messages", type=int, default=2_000)
    parser.add_argument("--io-ms", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    kafka, redis_url = ends.kafka_bootstrap, ends.redis_url
    total, io_total, batch = args.messages, min(args.io_messages, args.messages), args.batch
    topic = make_topic(kafka, args.partitions)
    sent = [envelope(b"p" * 122, ttl_ms=3_600_000) for _ in range(total)]
    produce(kafka, topic, sent, keys=[b"k%d" % (i % KEYS) for i in range(total)])
    slow = io_handler(args.io_ms)
    conc = args.concurrency
    runs: dict[str, tuple[int, str | None, Callable[[], Awaitable[float]]]] = {
        "plain async loop, no-op": (total, None, lambda: plain_loop(
            kafka, topic, total, batch, noop)),
        "AsyncGuardedConsumer, no-op": (total, "plain async loop, no-op", lambda: guarded(
            kafka, redis_url, topic, total, batch, noop, 1)),
        f"plain async loop, {args.io_ms:g} ms I/O": (io_total, None, lambda: plain_loop(
            kafka, topic, io_total, batch, slow)),
        f"AsyncGuardedConsumer, {args.io_ms:g} ms I/O x1": (
            io_total, f"plain async loop, {args.io_ms:g} ms I/O", lambda: guarded(
                kafka, redis_url, topic, io_total, batch, slow, 1)),
        f"AsyncGuardedConsumer, {args.io_ms:g} ms I/O x{conc}": (
            io_total, f"plain async loop, {args.io_ms:g} ms I/O", lambda: guarded(
                kafka, redis_url, topic, io_total, batch, slow, conc)),
    }
    print(f"{total} envelopes ({io_total} for the I/O rows) x {args.rounds} interleaved rounds, "
          f"batch {batch}, {args.partitions} partitions, {KEYS} keys")
    rates: dict[str, list[float]] = {name: [] for name in runs}
    lags: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, (count, _, make) in runs.items():
            elapsed, lag = asyncio.run(timed(make()))
            rates[name].append(count / elapsed)
            lags[name].append(1000 * percentile(lag, 99))
            print(f"  round {r + 1}: {name:40s} {count / elapsed:10,.0f} msg/s, loop lag p99 "
                  f"{lags[name][-1]:.1f} ms", flush=True)
    print(f"{'path':42s} {'min':>8s} {'median':>8s} {'/base':>6s}  loop lag p99 ms")
    for name, (count, base, _) in runs.items():
        median = statistics.median(rates[name])
        against = median / statistics.median(rates[base]) if base else 1.0
        print(f"{name:42s} {min(rates[name]):8,.0f} {median:8,.0f} {against:5.2f}x  "
              f"{statistics.median(lags[name]):6.1f}")
        table.add(table.Row(suite="async", path=name, rates=rates[name], baseline=base,
                            note=f"{name}: {count} msgs, loop lag p99 "
                                 f"{statistics.median(lags[name]):.1f} ms"))


if __name__ == "__main__":
    main()
