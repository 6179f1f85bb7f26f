"""Consumer throughput against the local stack (a benchmark, not a test).

    python -m bench.bench_consumer [--messages 100000] [--partitions 4] [--batch 1000] [--repeat 2]

Pre-produces ~200-byte envelopes once, then reads them all three ways, each in a fresh group:

  (a) a plain confluent-kafka loop that decodes every envelope (the baseline);
  (b) GuardedConsumer with a no-op handler (batch claim, done, commit);
  (c) the per-message dedup of common idempotency utilities: the plain loop plus one Redis
      ``SET NX PX`` round trip per message.

Targets: (b) >= 0.5 x (a) and (b) >= 10 x (c). Timing starts at the first record received, so
group joins are not counted, and (b) stops when every message is handled (done, committed).
Each variant runs ``--repeat`` times, interleaved; the best run counts (the local stack shares
its machine). CPU per message is printed too: this process's (every thread), and for (b) the
main thread's (the Python loop, apart from waiting) and the Redis server's. On a machine with
few cores their sum, with the broker's, bounds (b): everything runs on the same cores. The
outbox acknowledgement is off in (b): these envelopes were never in an outbox. Every run
writes its keys under a fresh prefix and deletes them afterwards (untimed), so runs do not see
each other's keys nor grow the shared Redis.
"""

from __future__ import annotations

import argparse
import resource
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

import redis
from confluent_kafka import Consumer

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.stack import LocalStack, create_topics
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace

CODEC = EnvelopeCodec()
PAYLOADS = PayloadCodec()


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-consumer-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


def plain_loop(bootstrap: str, topic: str, total: int, batch: int,
               per_message: Callable[[object], None] | None = None) -> float:
    """Seconds from the first record to the last, decoding every envelope."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen, started, process = 0, 0.0, 0.0
    try:
        while seen < total:
            msgs = consumer.consume(batch, 1.0)
            if msgs and not started:
                started, process = time.perf_counter(), process_cpu_s()
            for msg in msgs:
                if msg.error() is not None:
                    continue
                env = CODEC.decode(msg.value())
                PAYLOADS.decode_envelope(env)
                if per_message is not None:
                    per_message(env)
                seen += 1
            if msgs:
                consumer.commit(asynchronous=True)
        elapsed = time.perf_counter() - started
        print(f"    cpu per message: this process {(process_cpu_s() - process) / total * 1e6:.1f} us")
        return elapsed
    finally:
        consumer.close()


def guarded_loop(bootstrap: str, redis_url: str, topic: str, total: int, batch: int) -> float:
    keyspace = KeySpace(prefix=f"bench{uuid.uuid4().hex[:6]}")
    config = ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex[:8]}"},
        redis=RedisConfig(url=redis_url), scope=f"bench-{uuid.uuid4().hex[:6]}", topics=(topic,),
        batch_size=batch, keyspace=keyspace, ack_outbox=False)
    consumer = GuardedConsumer(config, handler=lambda ctx: None)
    info = redis.Redis.from_url(redis_url)
    started, cpu, process, server = 0.0, 0.0, 0.0, 0.0
    try:
        while consumer.stats().handled < total:
            if consumer.poll_once() and not started:
                started, cpu = time.perf_counter(), time.thread_time()
                process, server = process_cpu_s(), redis_cpu_s(info)
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
        process, server = process_cpu_s() - process, redis_cpu_s(info) - server
        stats = consumer.stats()
        assert stats.handled == total, stats
        us = 1e6 / total
        print(f"    (b) handled={stats.handled} redis round trips={stats.claim_round_trips} "
              f"commits={stats.commits}; waited on Redis {stats.redis_wait_s:.2f} s; "
              f"cpu per message: main thread {cpu * us:.1f} us, "
              f"this process {process * us:.1f} us, Redis {server * us:.1f} us")
        return elapsed
    finally:
        consumer.close()
        info.close()
        forget(redis_url, keyspace.pattern())


def process_cpu_s() -> float:
    """CPU seconds of this process so far, every thread (librdkafka's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis server used so far (INFO cpu, user + system, main thread)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def forget(redis_url: str, pattern: str) -> None:
    """Delete a run's keys (SCAN + UNLINK): runs add 100k keys each to the shared Redis."""
    client = redis.Redis.from_url(redis_url)
    try:
        names: list[bytes] = []
        for name in client.scan_iter(match=pattern, count=10_000):
            names.append(name)
            if len(names) >= 5_000:
                client.unlink(*names)
                names.clear()
        if names:
            client.unlink(*names)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--redis-url", help="Redis for (b) and (c) (default: the local stack's); "
                        "a private server started like the stack's (AOF, appendfsync always) "
                        "keeps other work's keys and AOF rewrites out of the figures")
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    if args.redis_url:
        ends = replace(ends, redis_url=args.redis_url)
    total = args.messages
    topic = make_topic(ends.kafka_bootstrap, args.partitions)
    sample = envelope(b"p" * 122, ttl_ms=3_600_000)
    print(f"producing {total} envelopes of {len(CODEC.encode(sample))} bytes to {topic} ...")
    produce(ends.kafka_bootstrap, topic, (envelope(b"p" * 122, ttl_ms=3_600_000)
                                          for _ in range(total)))

    client = redis.Redis.from_url(ends.redis_url)

    def set_nx_loop() -> float:
        # A fresh prefix per run: in a repeat, SET NX on the keys of the run before would
        # write nothing (no AOF write, no fsync) and measure the duplicate path only.
        prefix = f"bench{uuid.uuid4().hex[:6]}"

        def set_nx(env: object) -> None:
            client.set(f"{prefix}:dd:{env.id}", "1", nx=True,  # type: ignore[attr-defined]
                       px=3_600_000)

        try:
            return plain_loop(ends.kafka_bootstrap, topic, total, args.batch, set_nx)
        finally:
            forget(ends.redis_url, f"{prefix}:*")

    runs = {
        "(a) plain consumer + decode": lambda: plain_loop(ends.kafka_bootstrap, topic, total,
                                                          args.batch),
        "(b) GuardedConsumer, no-op handler": lambda: guarded_loop(
            ends.kafka_bootstrap, ends.redis_url, topic, total, args.batch),
        "(c) plain + SET NX per message": set_nx_loop,
    }
    rates: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, run in runs.items():
            elapsed = run()
            rates[name[:3]] = max(rates.get(name[:3], 0.0), total / elapsed)
            print(f"{name:40s} {total / elapsed:>10,.0f} msg/s   ({elapsed:.2f} s)")
    print("best of", args.repeat, {k: round(v) for k, v in rates.items()})
    client.close()
    a, b, c = rates["(a)"], rates["(b)"], rates["(c)"]
    print(f"(b)/(a) = {b / a:.2f}  (target >= 0.5)   (b)/(c) = {b / c:.1f}  (target >= 10)")


if __name__ == "__main__":
    main()
