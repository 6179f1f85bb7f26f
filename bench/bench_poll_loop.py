"""Where GuardedConsumer's poll loop spends its time at a steady rate (a benchmark, not a test).

    python -m bench.bench_poll_loop [--rate 6736] [--seconds 10] [--rounds 3] [--batch 1000]
                                    [--redis-url URL]

The plain producer of ``bench.bench_latency`` (idempotent, acks=all, ``linger.ms`` 5) sends
~200-byte envelopes on an open-loop schedule to a 4-partition topic; a GuardedConsumer in this
process (no-op handler, the latency bench's fetch settings) reads them. Per round it prints
the send -> handler latency (p50, p99, p999), how many ``poll_once`` calls it made and how long
they took, how many records each reading call brought, and how long the loop waited on Redis
replies (``ConsumerStats.redis_wait_s``) for how many round trips. ``bench.bench_latency
--split`` says which side a tail is on; this says, for the consumer's side, whether its poll
loop was waiting on Redis while records queued up in Kafka.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

from confluent_kafka import Producer

from bench.bench_latency import FETCH, STAMP
from bench.bench_producer import KAFKA, PlainEncoder, make_topic
from bench.stats import percentile
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.stack import LocalStack
from eoguard.store.keys import KeySpace


def feed(producer: Producer, topic: str, rate: float, count: int) -> None:
    """``count`` stamped envelopes, message k due at ``start + k / rate``."""
    encoder = PlainEncoder("bench-poll-loop")
    start = time.time() + 0.2
    for k in range(count):
        due = start + k / rate
        if (ahead := due - time.time()) > 0:
            time.sleep(ahead)
        producer.produce(topic, encoder.encode(STAMP.pack(due) + b"x" * 192, 600_000))
        producer.poll(0)
    producer.flush(30)


def one_round(bootstrap: str, redis_url: str, rate: float, seconds: float, batch: int) -> None:
    topic = make_topic(bootstrap, 4)
    latencies: list[float] = []
    consumer = GuardedConsumer(ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": f"loop-{uuid.uuid4().hex[:8]}",
               "auto.offset.reset": "earliest", **FETCH},
        redis=RedisConfig(url=redis_url), scope="poll-loop", topics=(topic,),
        keyspace=KeySpace(prefix=f"loop{uuid.uuid4().hex[:6]}"), poll_timeout_s=0.1,
        batch_size=batch),
        handler=lambda ctx: latencies.append((time.time() - STAMP.unpack(ctx.payload[:8])[0])
                                             * 1000))
    producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
    try:
        warm = threading.Thread(target=feed, args=(producer, topic, 50.0, 50))
        warm.start()  # the group joined and fetching, the producer connected
        while len(latencies) < 50:
            consumer.poll_once()
        warm.join()
        latencies.clear()
        waited, trips = consumer.stats().redis_wait_s, consumer.stats().claim_round_trips
        count = int(rate * seconds)
        sender = threading.Thread(target=feed, args=(producer, topic, rate, count))
        sender.start()
        calls: list[float] = []
        reads: list[float] = []
        while len(latencies) < count:
            started = time.perf_counter()
            got = consumer.poll_once()
            calls.append((time.perf_counter() - started) * 1000)
            if got:
                reads.append(got)
        sender.join()
        stats = consumer.stats()
    finally:
        consumer.close()
    latencies, calls, reads = sorted(latencies), sorted(calls), sorted(reads)
    at = percentile
    print(f"  send -> handler ms: p50 {at(latencies, 0.5):.1f}  p99 {at(latencies, 0.99):.1f}  "
          f"p999 {at(latencies, 0.999):.1f}")
    print(f"  poll_once: {len(calls)} calls, ms p50 {at(calls, 0.5):.2f}  p99 "
          f"{at(calls, 0.99):.2f}  max {max(calls):.1f}; loop {sum(calls) / 1000:.2f} s")
    print(f"  records per reading call: mean {statistics.mean(reads):.1f}  "
          f"p50 {at(reads, 0.5):.0f}  p99 {at(reads, 0.99):.0f}  max {max(reads)}")
    print(f"  waited on Redis {stats.redis_wait_s - waited:.2f} s over "
          f"{stats.claim_round_trips - trips} round trips")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=6736.0,
                        help="msg/s (default: 20%% of the callback baseline measured here)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000, help="ConsumerConfig.batch_size")
    parser.add_argument("--redis-url", help="Redis for eoguard (default: the local stack's)")
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    redis_url = args.redis_url or ends.redis_url
    print(f"{args.rate:,.0f} msg/s for {args.seconds:g} s, batch_size {args.batch}, "
          f"consumers {FETCH}, producer {KAFKA}")
    for round_no in range(1, args.rounds + 1):
        print(f"round {round_no} of {args.rounds}", flush=True)
        one_round(ends.kafka_bootstrap, redis_url, args.rate, args.seconds, args.batch)


if __name__ == "__main__":
    main()
