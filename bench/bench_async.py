"""Async producer throughput and event-loop lag against the local stack (a benchmark, not a test).

    python -m bench.bench_async [--messages 10000] [--rounds 3] [--concurrency 1000]
                                [--partitions 4] [--payload 200]

``--concurrency`` tasks on one event loop (an ASGI app's requests) send ``--messages`` in
all, each task one message after another, awaiting each one's outcome before the next;
timed from the first send until every task is done. Three ways, each to a fresh topic, in
``--rounds`` interleaved rounds:

  AIOProducer, await each   the baseline: confluent_kafka.aio.AIOProducer with the sync
                            baseline's librdkafka settings, ``await (await
                            producer.produce(...))``, each envelope encoded as the sync
                            baseline does; its batches of min(1000, concurrency) messages
                            (1000 is its default: with fewer tasks than that, each batch would
                            wait its 1 s buffer timeout), and a task calling ``poll(0.05)``
                            (it serves delivery reports only when it produces a batch, so
                            without one a batch's reports wait for the next batch);
  persist-first, delayed    AsyncGuardedProducer, ``await producer.send(...)``.

Meanwhile a probe task sleeps 5 ms again and again and records how late it woke: the event
loop's lag (p50, p99, max). Prints msg/s, the ratio of each median to the baseline's,
the per-message await (send -> guaranteed, p50/p99) and the lag; ``python -m bench producer
async`` prints these rows beside the synchronous producer's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from bench import table
from bench.bench_producer import KAFKA, PlainEncoder, make_topic
from bench.stats import percentile
from eoguard.config import ProducerConfig, RedisConfig
from eoguard.producer.aio import AsyncGuardedProducer
from eoguard.stack import LocalStack
from eoguard.store.keys import KeySpace

VARIANTS = ("AIOProducer, await each", "persist-first", "delayed")
PROBE_S = 0.005


class LagProbe:
    """How late a task that sleeps ``PROBE_S`` at a time wakes, each time, until stopped."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + PROBE_S
            await asyncio.sleep(PROBE_S)
            self.lags.append(loop.time() - due)

    def stop(self) -> list[float]:
        self._task.cancel()
        return sorted(self.lags)


async def drive(n: int, concurrency: int, send) -> tuple[float, list[float], list[float]]:
    """(seconds, sorted per-message await times, sorted loop lags) of ``n`` sends by
    ``concurrency`` tasks, each awaiting ``send(i)`` one after another."""
    waits: list[float] = []

    async def worker(first: int) -> None:
        for i in range(first, n, concurrency):
            sent = time.perf_counter()
            await send(i)
            waits.append(time.perf_counter() - sent)

    probe = LagProbe()
    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - started
    return elapsed, sorted(waits), probe.stop()


async def aio_baseline(bootstrap: str, topic: str, n: int, concurrency: int,
                       payload: bytes) -> tuple[float, list[float], list[float]]:
    from confluent_kafka.aio import AIOProducer  # noqa: PLC0415 - confluent-kafka >= 2.12

    encoder = PlainEncoder("bench-aio")
    producer = AIOProducer({"bootstrap.servers": bootstrap, **KAFKA},
                           batch_size=min(1000, concurrency))
    try:
        await (await producer.produce(topic, encoder.encode(payload, 600_000)))  # warm
        await producer.flush()

        async def send(i: int) -> None:
            delivered = await producer.produce(topic, encoder.encode(payload, 600_000),
                                               b"k%d" % (i & 31))
            await delivered

        async def serve_reports() -> None:  # else a batch's reports wait for the next batch
            while True:
                await producer.poll(0.05)

        poller = asyncio.create_task(serve_reports())
        try:
            return await drive(n, concurrency, send)
        finally:
            poller.cancel()
    finally:
        await producer.close()


async def guarded(bootstrap: str, redis_url: str, topic: str, n: int, concurrency: int,
                  payload: bytes, mode: str) -> tuple[float, list[float], list[float]]:
    config = ProducerConfig(kafka={"bootstrap.servers": bootstrap, **KAFKA},
                            redis=RedisConfig(url=redis_url), mode=mode,
                            keyspace=KeySpace(prefix=f"bench{time.time_ns() % 10**9}"),
                            default_ttl_s=600, keep_until="published")
    async with AsyncGuardedProducer(config) as producer:
        await producer.send(topic, payload)  # warm: metadata, connections, scripts

        async def send(i: int) -> None:
            await producer.send(topic, payload, key=b"k%d" % (i & 31))

        return await drive(n, concurrency, send)


def run(variant: str, bootstrap: str, redis_url: str, n: int, concurrency: int, partitions: int,
        payload: bytes) -> tuple[float, dict[str, float]]:
    topic = make_topic(bootstrap, partitions)
    if variant == VARIANTS[0]:
        coro = aio_baseline(bootstrap, topic, n, concurrency, payload)
    else:
        coro = guarded(bootstrap, redis_url, topic, n, concurrency, payload, variant)
    elapsed, waits, lags = asyncio.run(coro)
    return n / elapsed, {
        "p50_ms": 1000 * percentile(waits, 0.5), "p99_ms": 1000 * percentile(waits, 0.99),
        "lag_p50_ms": 1000 * percentile(lags, 0.5), "lag_p99_ms": 1000 * percentile(lags, 0.99),
        "lag_max_ms": 1000 * (lags[-1] if lags else float("nan"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--payload", type=int, default=200)
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    n, payload = args.messages, b"x" * args.payload
    print(f"{n} messages x {args.rounds} interleaved rounds by {args.concurrency} tasks "
          f"awaiting each send, {args.payload}-byte payloads, {args.partitions} partitions; "
          f"librdkafka {KAFKA}; loop lag: a {PROBE_S * 1000:.0f} ms sleep's overshoot")
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    infos: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            rate, info = run(variant, ends.kafka_bootstrap, ends.redis_url, n,
                             args.concurrency, args.partitions, payload)
            rates[variant].append(rate)
            infos[variant].append(info)
            print(f"  round {r + 1}: {variant:24s} {rate:10,.0f} msg/s, loop lag p99 "
                  f"{info['lag_p99_ms']:.1f} ms max {info['lag_max_ms']:.1f} ms", flush=True)
    base = statistics.median(rates[VARIANTS[0]])
    print(f"{'variant':26s} {'min':>8s} {'median':>8s} {'/aio':>6s}  await p50/p99 ms   "
          f"loop lag p50/p99/max ms")
    for v in VARIANTS:
        med = {k: statistics.median(i[k] for i in infos[v]) for k in infos[v][0]}
        median = statistics.median(rates[v])
        print(f"{v:26s} {min(rates[v]):8,.0f} {median:8,.0f} {median / base:5.2f}x  "
              f"{med['p50_ms']:6.1f} / {med['p99_ms']:6.1f}   {med['lag_p50_ms']:5.1f} / "
              f"{med['lag_p99_ms']:5.1f} / {med['lag_max_ms']:5.1f}")
        table.add(table.Row(
            suite="async", path=v, rates=rates[v],
            baseline=None if v == VARIANTS[0] else VARIANTS[0],
            guaranteed_ms=(med["p50_ms"], med["p99_ms"]),
            note=f"{v}: loop lag p99 {med['lag_p99_ms']:.1f} ms, max {med['lag_max_ms']:.1f} ms"))


if __name__ == "__main__":
    main()
