"""Consumer throughput and latency against the local stack (a benchmark, not a test).

    python -m bench.bench_consumer [--messages 100000] [--partitions 4] [--batch 1000]
                                   [--rounds 3] [--set-nx-messages 10000] [--rate 50]
                                   [--latency-s 10] [--redis-url URL]

Pre-produces ~200-byte envelopes once, then reads them all four ways, each in a fresh group:

  (a)  the baseline a user would write: a plain confluent-kafka loop that decodes every
       envelope with plain fastavro (``schemaless_reader`` after the 10-byte header, a parsed
       schema) and drops expired ones;
  (a') the same loop decoding with eoguard's codec (the baseline of earlier figures);
  (b)  GuardedConsumer with a no-op handler (batch claim, done, commit), outbox
       acknowledgements off;
  (b+) the same with outbox acknowledgements on, as a deployment runs: before each run (not
       timed) every envelope is stored in a fresh outbox as a GuardedProducer left it (kept
       until consumed, marked published), so each done mark also deletes its outbox record;
  (c)  the per-message dedup of common idempotency utilities: loop (a) plus one Redis
       ``SET NX PX`` round trip per message, over the first ``--set-nx-messages`` records;
  (f)  the Redis floor of a dedup store: loop (a) plus one pipeline per poll of a ``SET NX
       PXAT`` per message, no script; (f+) adds a ``DEL`` per message (an acknowledgement).
       Redis CPU per message of (b) against (f), and of (b+) against (f+), is printed as
       min / median / max and as a ratio of medians;

and a second topic of ~200-byte JSON orders no eoguard producer wrote, two ways:

  (p)  the baseline: the plain loop decoding each value with ``json.loads``;
  (q)  GuardedConsumer with ``plain_records`` (``json.loads``, the id from the order number by
       ``id_from_field``, a lifetime of the record's timestamp plus an hour), no-op handler.

Then latency at a trickle: ``--rate`` messages per second for ``--latency-s`` seconds, send ->
handler, for a plain ``poll()`` loop and for GuardedConsumer, with the same
``fetch.wait.max.ms``.

(q)/(p) beside (b)/(a) is what a consumer-first adoption costs against the envelope path.
Targets: (b)/(a) >= 0.55 (median) and (b)/(c) >= 25; at 50 msg/s eoguard's p50 within 20 ms
and its p99 within 50 ms of the plain consumer's. Timing starts at the first record received,
so group joins are not counted, and (b) stops when every message is handled (done,
committed). The variants run in ``--rounds`` interleaved rounds; min and median are reported
(the machine is shared and noisy). CPU per message is printed too: this process's (every
thread), and for (b) the main thread's (the Python loop, apart from waiting) and the Redis
server's. On a machine with
few cores their sum, with the broker's, bounds (b): everything runs on the same cores. Redis's
CPU per message is (b+)'s line to read for a deployment; (b) shows what the acknowledgement
adds. Every run
writes its keys under a fresh prefix and deletes them afterwards (untimed), so runs do not see
each other's keys nor grow the shared Redis.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import fastavro
import redis
from confluent_kafka import Consumer, Producer

from bench import table
from bench.machine_cpu import MachineCpu, redis_cpu_s
from bench.stats import percentile
from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.codec.plain import Lifetime, PlainRecords, id_from_field
from eoguard.codec.schemas import default_schema_dir
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.envelope import Envelope
from eoguard.modes import KeepUntil
from eoguard.stack import LocalStack, create_topics
from eoguard.stack.feed import envelope, produce
from eoguard.store.client import connect
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from eoguard.store.outbox_types import OutboxRecord

CODEC = EnvelopeCodec()
PAYLOADS = PayloadCodec()
ENVELOPE = fastavro.parse_schema(json.loads((default_schema_dir() / "envelope.avsc").read_text()))
ORDERS = PlainRecords(deserializer=json.loads, id_rule=id_from_field("bench-orders", "order"),
                      lifetime=Lifetime(ttl_s=3600))


def order_json(n: int) -> bytes:
    """A ~200-byte JSON order: what a producer nobody changed writes to a plain topic."""
    return json.dumps({"order": n, "customer": f"customer-{n % 977}", "total_cents": n % 99_991,
                       "currency": "EUR", "items": [{"sku": f"sku-{n % 31}", "qty": 1 + n % 3}],
                       "note": "x" * 48}).encode()


def plain_decode(value: bytes) -> dict[str, Any] | None:
    """What a user writes without eoguard: skip the single-object header, read the body with
    the parsed envelope schema, drop it when expired (None)."""
    env: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(value[10:]), ENVELOPE, None)
    expires = env["expires_at"]
    expires_ms = expires if isinstance(expires, int) else int(expires.timestamp() * 1000)
    return env if expires_ms > time.time() * 1000 else None


def eoguard_decode(value: bytes) -> object:
    env = CODEC.decode(value)
    PAYLOADS.decode_envelope(env)
    return env


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-consumer-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


def plain_loop(bootstrap: str, topic: str, total: int, batch: int,
               per_message: Callable[[object], None] | None = None,
               decode: Callable[[bytes], object] = plain_decode,
               per_batch: Callable[[list[Any]], None] | None = None,
               machine_us: list[float] | None = None) -> float:
    """Seconds from the first record to the last, decoding every envelope; ``per_batch`` is
    given each poll's decoded envelopes (before its commit)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen, started, process = 0, 0.0, 0.0
    try:
        while seen < total:
            msgs = consumer.consume(batch, 1.0)
            if msgs and not started:
                started, process, machine = time.perf_counter(), process_cpu_s(), MachineCpu()
            envs = []
            for msg in msgs:
                if msg.error() is not None:
                    continue
                env = decode(msg.value())
                if per_message is not None:
                    per_message(env)
                envs.append(env)
                seen += 1
                if seen == total:  # the topic may hold more (loop (c) reads a part of it)
                    break
            if per_batch is not None and envs:
                per_batch(envs)
            if msgs:
                consumer.commit(asynchronous=True)
        elapsed = time.perf_counter() - started
        if machine_us is not None:
            machine_us.append(machine.per_message_us(total))
        print(f"    cpu per message: this process {(process_cpu_s() - process) / total * 1e6:.1f} us")
        return elapsed
    finally:
        consumer.close()


def seed_outbox(redis_url: str, keyspace: KeySpace, topic: str, sent: list[Envelope]) -> None:
    """Store ``sent`` in ``keyspace``'s outbox as a GuardedProducer in persist-first mode with
    ``keep_until="consumed"`` leaves them once Kafka acknowledged them: published, kept until
    a consumer's acknowledgement deletes them."""
    client = connect(redis_url)
    outbox = Outbox(client, keyspace)
    try:
        for start in range(0, len(sent), 1000):
            chunk = [OutboxRecord(id=env.id, topic=topic, key=None, value=CODEC.encode(env),
                                  created_at_ms=env.created_at_ms,
                                  expires_at_ms=env.expires_at_ms)
                     for env in sent[start:start + 1000]]
            outbox.put(chunk, owner="bench-producer", keep_until=KeepUntil.CONSUMED,
                       resend_after_ms=3_600_000)
            outbox.mark_published([rec.id for rec in chunk], keep_until=KeepUntil.CONSUMED)
    finally:
        client.close()


def guarded_loop(bootstrap: str, redis_url: str, topic: str, total: int, batch: int,
                 plain_records: PlainRecords | None = None,
                 acked: list[Envelope] | None = None,
                 redis_us: list[float] | None = None,
                 machine_us: list[float] | None = None) -> float:
    """Seconds from the first record to the last handled; with ``acked`` (the topic's
    envelopes), outbox acknowledgements on, over an outbox seeded with them first."""
    keyspace = KeySpace(prefix=f"bench{uuid.uuid4().hex[:6]}")
    if acked is not None:
        seed_outbox(redis_url, keyspace, topic, acked)
    config = ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex[:8]}"},
        redis=RedisConfig(url=redis_url), scope=f"bench-{uuid.uuid4().hex[:6]}", topics=(topic,),
        batch_size=batch, keyspace=keyspace, ack_outbox=acked is not None,
        plain_records=plain_records)
    consumer = GuardedConsumer(config, handler=lambda ctx: None)
    info = redis.Redis.from_url(redis_url)
    started, cpu, process, server = 0.0, 0.0, 0.0, 0.0
    try:
        while consumer.stats().handled < total:
            if consumer.poll_once() and not started:
                started, cpu = time.perf_counter(), time.thread_time()
                process, server, machine = process_cpu_s(), redis_cpu_s(info), MachineCpu()
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
        process, server = process_cpu_s() - process, redis_cpu_s(info) - server
        stats = consumer.stats()
        assert stats.handled == total, stats
        us = 1e6 / total
        if redis_us is not None:
            redis_us.append(server * us)
        if machine_us is not None:
            machine_us.append(machine.per_message_us(total))
        if acked is not None:
            records = f"{keyspace.prefix}:ob:*:r:*"
            left = sum(1 for _ in info.scan_iter(match=records, count=10_000))
            print(f"    outbox keys left after the acknowledgements: {left}")
        print(f"    handled={stats.handled} redis round trips={stats.claim_round_trips} "
              f"commits={stats.commits}; waited on Redis {stats.redis_wait_s:.2f} s; "
              f"cpu per message: main thread {cpu * us:.1f} us, "
              f"this process {process * us:.1f} us, Redis {server * us:.1f} us")
        return elapsed
    finally:
        consumer.close()
        info.close()
        forget(redis_url, keyspace.pattern())


def floor_loop(bootstrap: str, redis_url: str, topic: str, total: int, batch: int, *,
               delete: bool, sent: list[Envelope], redis_us: list[float]) -> float:
    """The Redis floor of a dedup store: loop (a) plus, per poll, one pipeline of a ``SET key
    value NX PXAT`` per message (and, with ``delete``, a ``DEL`` of a key seeded for each, as
    an outbox acknowledgement does), no script. Prints Redis's CPU per message: the least a
    claim (and an acknowledgement) can cost with AOF ``appendfsync always``."""
    client = redis.Redis.from_url(redis_url)
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    try:
        if delete:  # untimed: one key per message for the DELs to remove
            for start in range(0, len(sent), 1000):
                pipe = client.pipeline(transaction=False)
                for env in sent[start:start + 1000]:
                    pipe.set(f"{prefix}:ob:{env.id}", b"r")
                pipe.execute()
        pxat = int(time.time() * 1000) + 3_600_000

        def write(envs: list[Any]) -> None:
            pipe = client.pipeline(transaction=False)
            for env in envs:
                pipe.set(f"{prefix}:dd:{env['id']}", b"d", nx=True, pxat=pxat)
                if delete:
                    pipe.delete(f"{prefix}:ob:{env['id']}")
            pipe.execute()

        server = redis_cpu_s(client)
        elapsed = plain_loop(bootstrap, topic, total, batch, per_batch=write)
        redis_us.append((redis_cpu_s(client) - server) / total * 1e6)
        print(f"    cpu per message: Redis {redis_us[-1]:.1f} us")
        return elapsed
    finally:
        client.close()
        forget(redis_url, f"{prefix}:*")


def _mmm(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def process_cpu_s() -> float:
    """CPU seconds of this process so far, every thread (librdkafka's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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


def latency(bootstrap: str, redis_url: str, rate: float, seconds: float,
            fetch_wait_ms: int, rounds: int) -> dict[str, list[list[float]]]:
    """Send -> handler latencies (ms) of a plain poll() loop and of GuardedConsumer, each
    reading its own topic fed at ``rate`` messages per second, in interleaved rounds."""
    out: dict[str, list[list[float]]] = {"plain": [], "eoguard": []}
    for _ in range(rounds):
        for name, runs in out.items():
            runs.append(_latency_run(name, bootstrap, redis_url, rate, seconds, fetch_wait_ms))
    return out


def _latency_run(name: str, bootstrap: str, redis_url: str, rate: float, seconds: float,
                 fetch_wait_ms: int) -> list[float]:
    topic = make_topic(bootstrap, 1)
    got: list[float] = []
    count = int(rate * seconds)
    kafka = {"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex[:8]}",
             "fetch.wait.max.ms": fetch_wait_ms, "auto.offset.reset": "earliest"}
    if name == "plain":
        consumer = Consumer({**kafka, "enable.auto.commit": False})
        consumer.subscribe([topic])

        def step() -> None:
            _plain_poll(consumer, got)
        close: Callable[[], None] = consumer.close
    else:
        guarded = GuardedConsumer(ConsumerConfig(
            kafka=kafka, redis=RedisConfig(url=redis_url), scope="lat", topics=(topic,),
            keyspace=KeySpace(prefix=f"bench{uuid.uuid4().hex[:6]}"), ack_outbox=False,
            poll_timeout_s=1.0),
            handler=lambda ctx: got.append(time.time() * 1000 - ctx.envelope.created_at_ms))

        def step() -> None:
            guarded.poll_once()
        close = guarded.close
    # One message first, through the producer that feeds the run: the consumer is then joined,
    # assigned and fetching, and the producer connected with its idempotent producer id (its
    # first send waits for both: hundreds of ms that are not the consumer's).
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "enable.idempotence": True})
    _feed(producer, topic, rate, 1)
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        step()
    got.clear()
    feeder = threading.Thread(target=_feed, args=(producer, topic, rate, count))
    feeder.start()
    deadline = time.monotonic() + seconds + 30
    while len(got) < count and time.monotonic() < deadline:
        step()
    feeder.join()
    close()
    return got


def _plain_poll(consumer: Consumer, got: list[float]) -> None:
    msg = consumer.poll(1.0)
    if msg is not None and msg.error() is None:
        env = plain_decode(msg.value())
        if env is not None:
            created = env["created_at"]
            created_ms = created if isinstance(created, int) else created.timestamp() * 1000
            got.append(time.time() * 1000 - created_ms)
        consumer.commit(asynchronous=True)


def _feed(producer: Producer, topic: str, rate: float, count: int) -> None:
    started = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, started + i / rate - time.monotonic()))
        producer.produce(topic, CODEC.encode(envelope(b"p" * 122, ttl_ms=3_600_000)))
        producer.poll(0)
    producer.flush(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set-nx-messages", type=int, default=10_000,
                        help="messages (c) reads: one round trip each, so its rate is steady "
                        "after a few thousand, and 100,000 would take minutes a round")
    parser.add_argument("--rate", type=float, default=50.0, help="messages/s of the latency run")
    parser.add_argument("--latency-s", type=float, default=10.0)
    parser.add_argument("--fetch-wait-ms", type=int, default=100,
                        help="fetch.wait.max.ms of both consumers in the latency run")
    parser.add_argument("--redis-url", help="Redis for (b) and (c) (default: the local stack's); "
                        "a private server started like the stack's (AOF, appendfsync always) "
                        "keeps other work's keys and AOF rewrites out of the figures")
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    if args.redis_url:
        ends = replace(ends, redis_url=args.redis_url)
    total = args.messages
    topic = make_topic(ends.kafka_bootstrap, args.partitions)
    sent = [envelope(b"p" * 122, ttl_ms=3_600_000) for _ in range(total)]
    print(f"producing {total} envelopes of {len(CODEC.encode(sent[0]))} bytes to {topic} ...")
    produce(ends.kafka_bootstrap, topic, sent)
    plain_topic = make_topic(ends.kafka_bootstrap, args.partitions)
    print(f"producing {total} JSON orders of {len(order_json(total))} bytes to {plain_topic} ...")
    produce(ends.kafka_bootstrap, plain_topic, (order_json(n) for n in range(total)))

    client = redis.Redis.from_url(ends.redis_url)
    set_nx_total = min(total, args.set_nx_messages)

    def set_nx_loop() -> float:
        # A fresh prefix per run: in a repeat, SET NX on the keys of the run before would
        # write nothing (no AOF write, no fsync) and measure the duplicate path only.
        prefix = f"bench{uuid.uuid4().hex[:6]}"

        def set_nx(env: object) -> None:
            client.set(f"{prefix}:dd:{env['id']}", "1", nx=True,  # type: ignore[index]
                       px=3_600_000)

        try:
            return plain_loop(ends.kafka_bootstrap, topic, set_nx_total, args.batch, set_nx)
        finally:
            forget(ends.redis_url, f"{prefix}:*")

    server_us: dict[str, list[float]] = {"(b)": [], "(b+)": [], "(f)": [], "(f+)": []}
    machine_us: dict[str, list[float]] = {"(a)": [], "(a')": [], "(b)": []}
    runs = {
        "(a)": ("plain consumer + plain fastavro decode", lambda: plain_loop(
            ends.kafka_bootstrap, topic, total, args.batch, machine_us=machine_us["(a)"])),
        "(a')": ("plain consumer + eoguard's codec", lambda: plain_loop(
            ends.kafka_bootstrap, topic, total, args.batch, decode=eoguard_decode,
            machine_us=machine_us["(a')"])),
        "(b)": ("GuardedConsumer, no-op handler", lambda: guarded_loop(
            ends.kafka_bootstrap, ends.redis_url, topic, total, args.batch,
            redis_us=server_us["(b)"], machine_us=machine_us["(b)"])),
        "(b+)": ("GuardedConsumer, outbox acks on", lambda: guarded_loop(
            ends.kafka_bootstrap, ends.redis_url, topic, total, args.batch, acked=sent,
            redis_us=server_us["(b+)"])),
        "(c)": ("(a) + SET NX per message", set_nx_loop),
        "(f)": ("(a) + pipelined SET per message (floor)", lambda: floor_loop(
            ends.kafka_bootstrap, ends.redis_url, topic, total, args.batch, delete=False,
            sent=sent, redis_us=server_us["(f)"])),
        "(f+)": ("(f) + pipelined DEL per message (floor)", lambda: floor_loop(
            ends.kafka_bootstrap, ends.redis_url, topic, total, args.batch, delete=True,
            sent=sent, redis_us=server_us["(f+)"])),
        "(p)": ("plain consumer + json.loads, plain topic", lambda: plain_loop(
            ends.kafka_bootstrap, plain_topic, total, args.batch, decode=json.loads)),
        "(q)": ("GuardedConsumer plain_records, no-op", lambda: guarded_loop(
            ends.kafka_bootstrap, ends.redis_url, plain_topic, total, args.batch,
            plain_records=ORDERS)),
    }
    counts = {key: set_nx_total if key == "(c)" else total for key in runs}
    rates: dict[str, list[float]] = {key: [] for key in runs}
    for round_no in range(args.rounds):
        print(f"round {round_no + 1} of {args.rounds}")
        for key, (name, run) in runs.items():
            elapsed = run()
            rates[key].append(counts[key] / elapsed)
            print(f"  {key:5s}{name:40s} {counts[key] / elapsed:>10,.0f} msg/s   "
                  f"({elapsed:.2f} s)")
    client.close()
    print(f"\n{total} messages, batch {args.batch}, {args.partitions} partitions, "
          f"{args.rounds} interleaved rounds (msg/s):")
    for key, (name, _) in runs.items():
        print(f"  {key:5s}{name:40s} min {min(rates[key]):>9,.0f}   "
              f"median {statistics.median(rates[key]):>9,.0f}")
    baselines = {"(a)": None, "(p)": None, "(q)": "(p)"}
    for key, (name, _) in runs.items():
        base = baselines.get(key, "(a)")
        table.add(table.Row(suite="consumer", path=f"{key} {name}", rates=rates[key],
                            baseline=None if base is None else f"{base} {runs[base][0]}",
                            note=f"{counts[key]} msgs, batch {args.batch}"))
    med = {key: statistics.median(values) for key, values in rates.items()}
    low = {key: min(values) for key, values in rates.items()}
    print(f"(b)/(a)  median {med['(b)'] / med['(a)']:.2f}  min {low['(b)'] / low['(a)']:.2f}"
          f"   (target >= 0.55, median)")
    old = "(a')"
    print(f"(b+)/(a) median {med['(b+)'] / med['(a)']:.2f}  min {low['(b+)'] / low['(a)']:.2f}"
          f"   (outbox acknowledgements on)")
    print(f"(b)/(a') median {med['(b)'] / med[old]:.2f}  min {low['(b)'] / low[old]:.2f}")
    print(f"(b)/(c)  median {med['(b)'] / med['(c)']:.1f}  min {low['(b)'] / low['(c)']:.1f}"
          f"   (target >= 25)")
    for key, floor in (("(b)", "(f)"), ("(b+)", "(f+)")):
        mine, least = server_us[key], server_us[floor]
        print(f"Redis CPU per message {key} {_mmm(mine)} us, floor {floor} {_mmm(least)} us: "
              f"{key}/{floor} median {statistics.median(mine) / statistics.median(least):.2f}"
              "   (target <= 1.5)")
    spent = {key: statistics.median(values) for key, values in machine_us.items()}
    for base in ("(a)", "(a')"):
        print(f"machine CPU per message (b) {spent['(b)']:.1f} us, {base} {spent[base]:.1f} us: "
              f"{spent['(b)'] / spent[base]:.2f}x (the ceiling of (b)/{base} on a machine "
              f"the loops keep busy is {spent[base] / spent['(b)']:.2f})")
    print(f"(q)/(p)  median {med['(q)'] / med['(p)']:.2f}  min {low['(q)'] / low['(p)']:.2f}"
          f"   (plain topic: GuardedConsumer against its json.loads loop)")

    if args.latency_s > 0:
        print(f"\nlatency at {args.rate:g} msg/s for {args.latency_s:g} s, fetch.wait.max.ms "
              f"{args.fetch_wait_ms} (send -> handler, ms):")
        found = latency(ends.kafka_bootstrap, ends.redis_url, args.rate, args.latency_s,
                        args.fetch_wait_ms, args.rounds)
        p50 = {name: [percentile(sorted(run), 0.5) for run in runs]
               for name, runs in found.items()}
        p99 = {name: [percentile(sorted(run), 0.99) for run in runs]
               for name, runs in found.items()}
        for name in found:
            print(f"  {name:8s} p50 per round {[round(v, 1) for v in p50[name]]}   "
                  f"p99 per round {[round(v, 1) for v in p99[name]]}")
        for name in found:
            table.add(table.Row(suite="consumer", path=f"latency {name} @ {args.rate:g}/s",
                                rates=[], e2e_ms=(statistics.median(p50[name]),
                                                  statistics.median(p99[name])),
                                note=f"fetch.wait.max.ms {args.fetch_wait_ms}"))
        d50 = statistics.median(p50["eoguard"]) - statistics.median(p50["plain"])
        d99 = statistics.median(p99["eoguard"]) - statistics.median(p99["plain"])
        print(f"  eoguard - plain (medians over rounds): p50 {d50:+.1f} ms (target <= 20)   "
              f"p99 {d99:+.1f} ms (target <= 50)")


if __name__ == "__main__":
    main()
