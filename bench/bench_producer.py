"""Producer throughput against the local stack (a benchmark, not a test).

    python -m bench.bench_producer [--messages 50000] [--rounds 3] [--partitions 4]
                                   [--payload 200] [--redis-url URL] [--only VARIANT ...]

Sends the same payloads five ways, each to a fresh topic, in ``--rounds`` interleaved rounds
(the order rotates each round), timed from the first send until every message is
acknowledged (``flush`` returned):

  baseline, fire-and-forget   what a user writes without eoguard: plain confluent-kafka,
                              idempotent, acks=all, the guarded producer's linger.ms,
                              batch.size and compression, each envelope encoded in the loop
                              with fastavro's ``schemaless_writer`` and a parsed schema (one
                              reused buffer), a uuid4 id, ``poll(0)`` now and then;
  baseline, callback          the same with a per-message delivery callback (what a producer
                              that wants to know about failures writes): the headline ratio;
  persist-first               GuardedProducer: every message in the Redis outbox before Kafka;
  delayed                     GuardedProducer: Redis only for messages Kafka has not acked in
                              the delay;
  floor, outbox               persist-first's floor (bench/producer_floor.py): the callback
                              baseline's envelopes and settings, each message stored by a
                              pipelined SET PXAT before Kafka (batches as the outbox's) and
                              deleted once acknowledged; no index, no script, no resend.

Prints min and median msg/s per variant, the ratios of the medians to both baselines, this
process's CPU per message (every thread, librdkafka's included), Redis's (``INFO cpu``: pass
``--redis-url`` of a private server so no other client is counted), Redis writes (and
avoided) and the latency from ``send`` to ``on_guaranteed`` (p50/p99); then persist-first
over its floor, round by round and per message (process, machine and Redis CPU).
"""

from __future__ import annotations

import argparse
import io
import statistics
import threading
import time
import uuid

import fastavro
import redis
from confluent_kafka import Producer

from bench import table
from bench.machine_cpu import MachineCpu, redis_cpu_s
from bench.producer_floor import FloorOutbox
from bench.stats import percentile
from eoguard.codec import ENVELOPE_SCHEMA, MAGIC, SchemaRegistry
from eoguard.config import ProducerConfig, RedisConfig
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import LocalStack, create_topics
from eoguard.store.keys import KeySpace

BATCH = ProducerConfig.__dataclass_fields__["batch_max_messages"].default  # the default
MAX_QUEUE = 200_000  # messages waiting for Redis, at most (GuardedProducer's and the floor's)
KAFKA = {"linger.ms": 5, "acks": "all", "enable.idempotence": True,
         "queue.buffering.max.messages": 500_000}


class CpuMeter:
    """CPU seconds of this process and of Redis (``INFO cpu``) since construction."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.process = time.process_time()
        self.redis = redis_cpu_s(client)

    def per_message_us(self, n: int) -> tuple[float, float]:
        """(process, Redis) CPU microseconds per message so far."""
        return ((time.process_time() - self.process) / n * 1e6,
                (redis_cpu_s(self.client) - self.redis) / n * 1e6)


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-producer-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


class PlainEncoder:
    """The envelope as a user encodes it with fastavro: a parsed schema, one reused buffer."""

    def __init__(self, producer_id: str) -> None:
        current = SchemaRegistry.default().get(ENVELOPE_SCHEMA)
        self.schema = fastavro.parse_schema(current.schema)
        self.header = MAGIC + current.fingerprint
        self.producer_id = producer_id
        self.buffer = io.BytesIO()

    def encode(self, payload: bytes, ttl_ms: int) -> bytes:
        now = time.time_ns() // 1_000_000
        return self.encode_as(str(uuid.uuid4()), payload, now, now + ttl_ms)

    def encode_as(self, message_id: str, payload: bytes, now_ms: int,
                  expires_at_ms: int) -> bytes:
        """The envelope of ``message_id``, created at ``now_ms``."""
        buf = self.buffer
        buf.seek(0)
        buf.truncate()
        buf.write(self.header)
        fastavro.schemaless_writer(buf, self.schema, {
            "id": message_id, "expires_at": expires_at_ms, "created_at": now_ms,
            "producer": self.producer_id, "attempt": 1, "payload_schema": None,
            "payload": payload, "headers": {}, "payload_fingerprint": None})
        return buf.getvalue()


def baseline(bootstrap: str, topic: str, n: int, payload: bytes, *,
             callback: bool) -> tuple[float, dict[str, float]]:
    """(seconds, {"cpu_us": process CPU microseconds per message})."""
    producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
    encoder = PlainEncoder("bench-baseline")
    failed: list[object] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    extra = {"on_delivery": delivered} if callback else {}
    producer.produce(topic, encoder.encode(payload, 600_000))  # warm: metadata, connections
    producer.flush(30)
    started, cpu, machine = time.perf_counter(), time.process_time(), MachineCpu()
    for i in range(n):
        value = encoder.encode(payload, 600_000)
        while True:
            try:
                producer.produce(topic, value, b"k%d" % (i & 31), **extra)
                break
            except BufferError:
                producer.poll(0.001)
        if i & 1023 == 0:
            producer.poll(0)
    left = producer.flush(120)
    assert left == 0, f"{left} messages not delivered"
    assert not failed, failed[:3]
    return time.perf_counter() - started, {"cpu_us": (time.process_time() - cpu) / n * 1e6,
                                           "machine_us": machine.per_message_us(n)}


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
                            keep_until="published", max_queue_messages=MAX_QUEUE,
                            max_queue_bytes=256 * 1024 * 1024)
    admin = redis.Redis.from_url(redis_url)
    with GuardedProducer(config) as producer:
        producer.send(topic, payload)  # warm: metadata, connections, scripts
        producer.flush(30)
        base = producer.stats()
        meter, machine = CpuMeter(admin), MachineCpu()
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
        machine_us = machine.per_message_us(n)
        assert left == 0, f"{left} messages outstanding"
        stats = producer.stats()
    admin.close()
    time.sleep(0.2)  # the callback thread finishes the last batch
    lat = sorted(latencies)
    return elapsed, {
        "persisted": stats.persisted - base.persisted,
        "avoided": stats.redis_writes_avoided - base.redis_writes_avoided,
        "p50_ms": 1000 * percentile(lat, 0.5),
        "p99_ms": 1000 * percentile(lat, 0.99),
        "delay_ms": stats.current_delay_ms,
        "guaranteed": stats.guaranteed - base.guaranteed,
        "cpu_us": cpu_us,
        "redis_us": redis_us,
        "machine_us": machine_us,
    }


def floor(bootstrap: str, redis_url: str, topic: str, n: int,
          payload: bytes) -> tuple[float, dict[str, float]]:
    """persist-first's floor (:class:`FloorOutbox`) with the baselines' envelopes and
    GuardedProducer's batches: (seconds, info). Its envelopes cost this process what the
    baselines' cost (fastavro, uuid4), more than eoguard's codec: where this process's CPU
    bounds the rate, persist-first can pass its floor."""
    producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
    client = redis.Redis.from_url(redis_url)
    encoder = PlainEncoder("bench-floor")
    outbox = FloorOutbox(producer, client, topic, f"benchfloor{uuid.uuid4().hex[:6]}:",
                         batch=BATCH, max_waiting=MAX_QUEUE)
    producer.produce(topic, encoder.encode(payload, 600_000))  # warm: metadata, connections
    producer.flush(30)
    client.ping()
    meter, machine = CpuMeter(client), MachineCpu()
    started = time.perf_counter()
    outbox.start()
    for i in range(n):
        message_id = str(uuid.uuid4())
        now = time.time_ns() // 1_000_000
        outbox.send(message_id, encoder.encode_as(message_id, payload, now, now + 600_000),
                    now + 600_000, b"k%d" % (i & 31))
    left = outbox.flush(120)
    elapsed = time.perf_counter() - started  # as GuardedProducer.flush: the last DELs follow
    cpu_us, redis_us = meter.per_message_us(n)
    machine_us = machine.per_message_us(n)
    leftover = outbox.close()
    client.close()
    assert left == 0, f"{left} messages not delivered"
    assert not outbox.failed, outbox.failed[:3]
    assert leftover == 0, f"{leftover} records left in Redis"
    return elapsed, {"cpu_us": cpu_us, "redis_us": redis_us, "machine_us": machine_us,
                     "persisted": n, "avoided": 0}


FLOOR = "floor, outbox"
VARIANTS = ("baseline, fire-and-forget", "baseline, callback", "persist-first", "delayed", FLOOR)


def run(variant: str, bootstrap: str, redis_url: str, n: int, partitions: int,
        payload: bytes) -> tuple[float, dict[str, float]]:
    topic = make_topic(bootstrap, partitions)
    if variant.startswith("baseline"):
        elapsed, info = baseline(bootstrap, topic, n, payload, callback="callback" in variant)
    elif variant == FLOOR:
        elapsed, info = floor(bootstrap, redis_url, topic, n, payload)
    else:
        elapsed, info = guarded(bootstrap, redis_url, topic, n, payload, variant)
    return n / elapsed, info


def describe(info: list[dict[str, float]], n: int) -> str:
    med = {key: statistics.median(i[key] for i in info) for key in info[0]}
    text = f"cpu {med['cpu_us']:.1f} us/msg (machine {med['machine_us']:.1f})"
    if "persisted" in med:
        text += (f", redis {med['redis_us']:.1f} us/msg; redis writes {med['persisted']:.0f} "
                 f"({med['persisted'] / n:.1%}), avoided {med['avoided']:.0f}")
    if "p50_ms" in med:
        text += (f"; guaranteed p50 {med['p50_ms']:.1f} ms p99 {med['p99_ms']:.1f} ms; "
                 f"delay {med['delay_ms']:.0f} ms")
    return text


def add_row(variant: str, rates: list[float], info: list[dict[str, float]], n: int,
            payload: int) -> None:
    """The variant's row of ``python -m bench``'s table (medians over the rounds)."""
    def med(key: str) -> float | None:
        return statistics.median(i[key] for i in info) if key in info[0] else None

    guaranteed = (med("p50_ms"), med("p99_ms"))
    persisted = med("persisted")
    table.add(table.Row(
        suite="producer", path=variant, rates=rates,
        baseline=None if variant == VARIANTS[1] else VARIANTS[1],
        cpu_us=med("cpu_us"), redis_cpu_us=med("redis_us"),
        redis_writes=None if persisted is None else persisted / n,
        guaranteed_ms=None if guaranteed[0] is None else guaranteed,  # type: ignore[arg-type]
        note=f"{n} x {payload} B"))


def against_floor(mine: list[float], least: list[float], my_info: list[dict[str, float]],
                  least_info: list[dict[str, float]]) -> str:
    """persist-first / floor: of the rates round by round (the same round's conditions) and
    of the medians, and of the CPU per message (process, machine, Redis)."""
    rounds = [m / f for m, f in zip(mine, least, strict=True)]

    def cost(key: str) -> str:
        mine_us = statistics.median(i[key] for i in my_info)
        least_us = statistics.median(i[key] for i in least_info)
        return f"{key} {mine_us:.1f} / {least_us:.1f} = {mine_us / least_us:.2f}x"

    return (f"persist-first / floor: {statistics.median(mine) / statistics.median(least):.2f}x "
            f"of the medians; by round {' '.join(f'{r:.2f}' for r in rounds)}; per message "
            f"{', '.join(cost(k) for k in ('cpu_us', 'machine_us', 'redis_us'))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--payload", type=int, default=200)
    parser.add_argument("--only", choices=VARIANTS, action="append",
                        help="run only these variants (repeatable)")
    parser.add_argument("--redis-url", help="Redis for the outbox (default: the local stack's); "
                        "a private server keeps INFO cpu free of other clients")
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    redis_url = args.redis_url or ends.redis_url
    n, payload = args.messages, b"x" * args.payload
    variants = args.only or list(VARIANTS)
    size = len(PlainEncoder("bench-baseline").encode(payload, 600_000))
    print(f"{n} messages x {args.rounds} interleaved rounds, {args.payload}-byte payloads "
          f"({size}-byte envelopes), {args.partitions} partitions; librdkafka {KAFKA}; "
          f"GuardedProducer: outbox batches of <= {BATCH} messages, keep_until=published, "
          f"Redis {redis_url}")
    rates: dict[str, list[float]] = {v: [] for v in variants}
    infos: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
            rate, info = run(variant, ends.kafka_bootstrap, redis_url, n, args.partitions,
                             payload)
            rates[variant].append(rate)
            infos[variant].append(info)
            print(f"  round {r + 1}: {variant:26s} {rate:10,.0f} msg/s", flush=True)
    medians = {v: statistics.median(rates[v]) for v in variants}
    ff, cb = medians.get(VARIANTS[0]), medians.get(VARIANTS[1])
    print(f"{'variant':28s} {'min':>10s} {'median':>10s}  {'/callback':>9s} {'/f&f':>6s}")
    for v in variants:
        ratio_cb = f"{medians[v] / cb:8.2f}x" if cb else "       - "
        ratio_ff = f"{medians[v] / ff:5.2f}x" if ff else "    - "
        print(f"{v:28s} {min(rates[v]):10,.0f} {medians[v]:10,.0f}  {ratio_cb} {ratio_ff}  "
              f"{describe(infos[v], n)}")
        add_row(v, rates[v], infos[v], n, args.payload)
    if VARIANTS[1] in variants:
        base = statistics.median(i["machine_us"] for i in infos[VARIANTS[1]])
        for v in variants[variants.index(VARIANTS[1]) + 1:]:
            cost = statistics.median(i["machine_us"] for i in infos[v])
            print(f"{v}: machine CPU per message {cost / base:.2f}x the callback baseline's "
                  f"(its ceiling on a machine both keep busy: {base / cost:.2f}x)")
    if FLOOR in variants and VARIANTS[2] in variants:
        print(against_floor(rates[VARIANTS[2]], rates[FLOOR], infos[VARIANTS[2]], infos[FLOOR]))
    redis.Redis.from_url(redis_url).close()


if __name__ == "__main__":
    main()
