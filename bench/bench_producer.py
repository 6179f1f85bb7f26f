"""Producer throughput against the local stack (a benchmark, not a test).

    python -m bench.bench_producer [--messages 100000] [--partitions 4] [--payload 200]

Sends the same ~200-byte payloads three ways, each to a fresh topic, timed from the first
send until every message is acknowledged (``flush`` returned):

  baseline       plain confluent-kafka ``produce`` of the same Avro envelopes (acks=all,
                 idempotent, same linger), calling ``poll(0)`` in its loop as usual;
                 reported twice: encoding each envelope in the loop, and pre-encoded;
  persist-first  GuardedProducer: every message in the Redis outbox before Kafka;
  delayed        GuardedProducer: Redis only for messages Kafka has not acked in the delay.

Prints msgs/s, the ratio to the baseline, this process's CPU per message (every thread,
librdkafka's included) and Redis's (``INFO cpu``: with the shared stack Redis that counts
other clients too; ``--redis-url`` of a private server does not), Redis writes (and avoided)
and the latency from ``send`` to ``on_guaranteed`` (p50/p99). Targets: persist-first >= 0.3x,
delayed >= 0.6x with Redis writes <= 5% of messages.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

import redis
from confluent_kafka import Producer

from eoguard.codec import EnvelopeCodec
from eoguard.config import ProducerConfig, RedisConfig
from eoguard.envelope import Envelope
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import LocalStack, create_topics
from eoguard.store.keys import KeySpace

CODEC = EnvelopeCodec()
BATCH = ProducerConfig.__dataclass_fields__["batch_max_messages"].default  # the default
KAFKA = {"linger.ms": 5, "acks": "all", "enable.idempotence": True,
         "queue.buffering.max.messages": 500_000}


class CpuMeter:
    """CPU seconds of this process and of Redis (``INFO cpu``) since construction."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.process = time.process_time()
        self.redis = self._redis()

    def _redis(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def per_message_us(self, n: int) -> tuple[float, float]:
        """(process, Redis) CPU microseconds per message so far."""
        return ((time.process_time() - self.process) / n * 1e6,
                (self._redis() - self.redis) / n * 1e6)


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-producer-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


def envelope_value(payload: bytes) -> bytes:
    return CODEC.encode(Envelope.create(payload, ttl_ms=600_000, producer="bench"))


def baseline(bootstrap: str, topic: str, n: int, payload: bytes, *,
             encode: bool) -> tuple[float, float]:
    """(seconds, process CPU microseconds per message)."""
    producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
    values = None if encode else [envelope_value(payload) for _ in range(n)]
    producer.produce(topic, envelope_value(payload))  # warm: metadata, connections
    producer.flush(30)
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        value = envelope_value(payload) if values is None else values[i]
        while True:
            try:
                producer.produce(topic, value, b"k%d" % (i & 31))
                break
            except BufferError:
                producer.poll(0.001)
        if i & 1023 == 0:
            producer.poll(0)
    left = producer.flush(120)
    assert left == 0, f"{left} messages not delivered"
    return time.perf_counter() - started, (time.process_time() - cpu) / n * 1e6


def guarded(bootstrap: str, redis_url: str, topic: str, n: int, payload: bytes,
            mode: str) -> tuple[float, dict[str, float]]:
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    lock = threading.Lock()

    def guaranteed(handle) -> None:  # on eoguard's callback thread
        now = time.perf_counter()
        with lock:
            t = sent_at.get(handle.id)
        if t is not None:
            latencies.append(now - t)

    prefix = f"bench{uuid.uuid4().hex[:6]}"
    config = ProducerConfig(kafka={"bootstrap.servers": bootstrap, **KAFKA},
                            redis=RedisConfig(url=redis_url), mode=mode,
                            keyspace=KeySpace(prefix=prefix), default_ttl_s=600,
                            keep_until="published", max_queue_messages=200_000,
                            max_queue_bytes=256 * 1024 * 1024)
    admin = redis.Redis.from_url(redis_url)
    with GuardedProducer(config) as producer:
        producer.send(topic, payload)  # warm: metadata, connections, scripts
        producer.flush(30)
        base = producer.stats()
        meter = CpuMeter(admin)
        started = time.perf_counter()
        for i in range(n):
            if i & 15:
                producer.send(topic, payload, key=b"k%d" % (i & 31))
            else:  # every 16th message carries a callback that samples the guaranteed latency
                sent = time.perf_counter()
                handle = producer.send(topic, payload, key=b"k%d" % (i & 31),
                                       on_guaranteed=guaranteed)
                with lock:
                    sent_at[handle.id] = sent
        left = producer.flush(120)
        elapsed = time.perf_counter() - started
        cpu_us, redis_us = meter.per_message_us(n)
        assert left == 0, f"{left} messages outstanding"
        stats = producer.stats()
    admin.close()
    time.sleep(0.2)  # the callback thread finishes the last batch
    lat = sorted(latencies)
    return elapsed, {
        "persisted": stats.persisted - base.persisted,
        "avoided": stats.redis_writes_avoided - base.redis_writes_avoided,
        "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
        "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1] if lat else float("nan"),
        "delay_ms": stats.current_delay_ms,
        "guaranteed": stats.guaranteed - base.guaranteed,
        "cpu_us": cpu_us,
        "redis_us": redis_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--payload", type=int, default=200)
    parser.add_argument("--only", choices=["baseline", "persist-first", "delayed"])
    parser.add_argument("--redis-url", help="Redis for the outbox (default: the local stack's); "
                        "a private server keeps INFO commandstats free of other clients")
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    redis_url = args.redis_url or ends.redis_url
    n, payload = args.messages, b"x" * args.payload
    print(f"{n} messages, {args.payload}-byte payloads "
          f"({len(envelope_value(payload))}-byte envelopes), {args.partitions} partitions; "
          f"GuardedProducer: outbox batches of <= {BATCH} messages, keep_until=published, "
          f"Redis {redis_url}")
    rows: list[tuple[str, float, str]] = []
    base_rate = None
    if args.only in (None, "baseline"):
        t, cpu_us = baseline(ends.kafka_bootstrap, make_topic(ends.kafka_bootstrap,
                                                              args.partitions), n,
                             payload, encode=True)
        base_rate = n / t
        rows.append(("baseline (encode in loop)", base_rate, f"cpu {cpu_us:.1f} us/msg"))
        t, cpu_us = baseline(ends.kafka_bootstrap, make_topic(ends.kafka_bootstrap,
                                                              args.partitions), n,
                             payload, encode=False)
        rows.append(("baseline (pre-encoded)", n / t, f"cpu {cpu_us:.1f} us/msg"))
    for mode in ("persist-first", "delayed"):
        if args.only not in (None, mode):
            continue
        t, info = guarded(ends.kafka_bootstrap, redis_url,
                          make_topic(ends.kafka_bootstrap, args.partitions), n, payload, mode)
        rows.append((f"GuardedProducer {mode}", n / t,
                     f"cpu {info['cpu_us']:.1f} us/msg, redis {info['redis_us']:.1f} us/msg; "
                     f"redis writes {info['persisted']:.0f} ({info['persisted'] / n:.1%}), "
                     f"avoided {info['avoided']:.0f}; guaranteed p50 {info['p50_ms']:.1f} ms "
                     f"p99 {info['p99_ms']:.1f} ms; delay {info['delay_ms']:.0f} ms"))
    for name, rate, extra in rows:
        ratio = f"{rate / base_rate:5.2f}x" if base_rate else "   - "
        print(f"{name:30s} {rate:10,.0f} msg/s  {ratio}  {extra}")
    redis.Redis.from_url(redis_url).close()


if __name__ == "__main__":
    main()
