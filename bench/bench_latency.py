"""End-to-end latency, produce -> handler, with and without eoguard (a benchmark, not a test).

    python -m bench.bench_latency [--seconds 10] [--rounds 3] [--max-rate N] [--redis-url URL]
                                  [--trace]

An open-loop schedule: message k is due at ``start + k / rate`` and its latency is measured
from that due time (a sender that falls behind adds its lag, as a real load would), to the
moment the handler sees it, in a consumer process of its own. Five pipelines, each at a
trickle of 50 msg/s and at 20% and 60% of the callback baseline's maximum rate (``--max-rate``;
else the producer suite's median when ``python -m bench`` ran it first, else the median of three
runs of ``bench.bench_producer``'s callback baseline), and all but delayed once more at 60% of
persist-first's own maximum (``--persist-first-max-rate``, found the same way), since at 60% of
the callback baseline persist-first is past what it can send:

  plain           confluent-kafka producer (idempotent, acks=all, per-message callback,
                  fastavro envelope) -> confluent-kafka ``poll()`` loop (auto-commit, as a
                  user writes it) decoding with fastavro;
  persist-first   GuardedProducer -> GuardedConsumer;
  delayed         GuardedProducer (delayed mode) -> GuardedConsumer;
  floor           the plain producer -> the floor consumer: the floor of ``delayed`` (whose
                  producer does about what plain's does);
  floor-pf        the floor sender -> the floor consumer: the floor of ``persist-first``.

The floors (:mod:`bench.latency_floor`) ask Redis for what eoguard does, in plain pipelined
commands and nothing more: the floor consumer claims each record of a batch (``SET NX PXAT``,
one round trip, awaited) before it handles them, then marks the batch done and deletes the
senders' outbox records (one round trip, awaited) and commits asynchronously; the floor sender
writes each message to Redis (``SET PXAT``, a round trip per batch of what is queued, awaited)
before it produces it, and deletes it once Kafka acknowledged it. Where eoguard misses a
target, its distance to its floor in the same round says how much of the miss is eoguard's
and how much the Redis round trips' on this machine.

With ``--split`` three more say which side a tail is on: ``persist-first>plain`` and
``delayed>plain`` (a GuardedProducer read by the plain ``poll()`` loop: the producer's share)
and ``plain>guarded`` (the plain producer read by GuardedConsumer: the consumer's share).

Every consumer uses the same fetch settings (``fetch.wait.max.ms``, ``fetch.min.bytes``) and
every producer the same ``linger.ms``. Rounds are interleaved (every pipeline at every rate,
then again), since one point's tail moves with whatever else the machine did in those seconds.
Prints each point's p50/p99 (p999 only where a point has at least 10,000 samples), then per
pipeline and rate the min, median and max over the rounds of p50 and p99 and of their difference
to plain in the same round, and for persist-first and delayed likewise their difference to
their floors in the same round (``delayed minus floor``). Each point also prints the longest
stalls Redis's latency monitor saw meanwhile (an AOF fsync, a fork), which explain an eoguard
tail plain does not have, and how busy the machine's cores were (``cpu``, every process's share
of every core).
With ``--trace`` the eoguard consumers run in trace mode and each eoguard point also prints
where its tail messages spent their time, stage by stage (:mod:`bench.trace_report`). Every
point writes under a key prefix of its own, deleted once the point is over.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import statistics
import struct
import time
import uuid
from typing import Any

import fastavro
import redis
from confluent_kafka import Consumer, Producer

from bench import table
from bench.bench_producer import KAFKA, PlainEncoder, baseline, guarded, make_topic
from bench.latency_floor import TTL_MS, FloorConsumer, FloorSender
from bench.machine_cpu import MachineCpu
from bench.stats import percentile
from bench.trace_report import SchedStat, TracedRun, report, tasks
from eoguard.codec import ENVELOPE_SCHEMA, SchemaRegistry
from eoguard.config import ConsumerConfig, ProducerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import LocalStack
from eoguard.store.client import reply_text
from eoguard.store.keys import KeySpace

FETCH = {"fetch.wait.max.ms": 10, "fetch.min.bytes": 1}
STAMP = struct.Struct("<d")  # the payload: the message's due time, epoch seconds
PIPELINES = ("plain", "persist-first", "delayed", "floor", "floor-pf")
FLOORS = {"delayed": "floor", "persist-first": "floor-pf"}  # each eoguard pipeline's floor
SPLITS = ("persist-first>plain", "delayed>plain", "plain>guarded")
POINTS = ("trickle", "20%", "60%", "60% pf")


def sides(pipeline: str) -> tuple[str, str]:
    """The producer (``plain``, ``floor-pf`` or a GuardedProducer mode) and the consumer
    (``plain``, ``floor`` or ``guarded``) of ``pipeline``: ``a>b`` names both; ``plain`` is
    plain end to end, ``floor`` the plain producer read by the floor consumer, ``floor-pf``
    the floor sender read by it, a mode that mode's GuardedProducer read by GuardedConsumer."""
    if ">" in pipeline:
        sender, reader = pipeline.split(">")
        return sender, reader
    if pipeline in ("floor", "floor-pf"):
        return ("plain" if pipeline == "floor" else pipeline), "floor"
    return pipeline, "plain" if pipeline == "plain" else "guarded"


def consume(pipeline: str, bootstrap: str, redis_url: str, prefix: str, topic: str,
            expect: int, ready: Any, out: Any, trace: bool = False) -> None:
    """In a process of its own: read ``expect`` messages, put their latencies (ms) on ``out``,
    with a :class:`~bench.trace_report.TracedRun` (None unless ``trace`` and eoguard's)."""
    latencies: list[float] = []
    due_ns: dict[str, int] = {}  # trace mode: message id -> due time
    started: list[tuple[dict[int, tuple[int, int]], float]] = []  # the first warm-up seen
    group = f"lat-{uuid.uuid4().hex[:8]}"
    kafka = {"bootstrap.servers": bootstrap, "group.id": group,
             "auto.offset.reset": "earliest", **FETCH}

    def seen(payload: bytes, message_id: str | None = None) -> None:
        due = STAMP.unpack(payload[:8])[0]
        if due == 0.0:  # a warm-up message: the pipeline is up end to end
            if not started:
                started.append((tasks(), time.monotonic()))
            ready.set()
        else:
            latencies.append((time.time() - due) * 1000)
            if message_id is not None:
                due_ns[message_id] = int(due * 1e9)

    deadline = time.monotonic() + 600
    if sides(pipeline)[1] == "plain":
        schema = fastavro.parse_schema(SchemaRegistry.default().get(ENVELOPE_SCHEMA).schema)
        consumer = Consumer(kafka)
        consumer.subscribe([topic])
        while len(latencies) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.1)  # one at a time: returns as soon as a message is in
            if msg is not None and msg.error() is None:
                env = fastavro.schemaless_reader(io.BytesIO(msg.value()[10:]), schema, None)
                seen(env["payload"])
        consumer.close()
        out.put((latencies, None))
        return
    if sides(pipeline)[1] == "floor":
        floor = FloorConsumer(kafka, redis.Redis.from_url(redis_url), topic, prefix, seen)
        while len(latencies) < expect and time.monotonic() < deadline:
            floor.poll_once(0.1)
        floor.close()
        out.put((latencies, None))
        return
    config = ConsumerConfig(kafka=kafka, redis=RedisConfig(url=redis_url), scope="latency",
                            topics=(topic,), keyspace=KeySpace(prefix=prefix),
                            poll_timeout_s=0.1, ack_outbox=True,
                            trace_messages=expect + 1000 if trace else 0)  # warm-ups too
    guarded = GuardedConsumer(config, handler=lambda ctx: seen(
        ctx.payload, ctx.message_id if trace else None))
    while len(latencies) < expect and time.monotonic() < deadline:
        guarded.poll_once()
    ended = tasks(), time.monotonic()  # before close: librdkafka's threads end with it
    guarded.close()  # the last batches' done marks land and commit
    traced = None
    if trace and started:
        (start, at), (end, end_at) = started[0], ended
        traced = TracedRun(guarded.trace(), due_ns, SchedStat.between(start, end), end_at - at)
    out.put((latencies, traced))


def warm_up(send: Any, ready: Any) -> None:
    """Send warm-up messages until the consumer has seen one (group joined, fetching)."""
    deadline = time.monotonic() + 90
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            raise RuntimeError("the consumer saw no warm-up message within 90 s")
        send(STAMP.pack(0.0))


def send_all(pipeline: str, bootstrap: str, redis_url: str, prefix: str, topic: str,
             rate: float, count: int, ready: Any) -> None:
    """Warm up, then send ``count`` messages on the open-loop schedule of ``rate`` per second."""
    mode = sides(pipeline)[0]
    if mode == "plain":
        producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
        encoder = PlainEncoder("bench-latency")

        def send(payload: bytes) -> None:
            producer.produce(topic, encoder.encode(payload, TTL_MS),
                             on_delivery=lambda err, msg: None)
            producer.poll(0)

        warm_up(send, ready)
        schedule(send, rate, count)
        producer.flush(60)
        return
    if mode == "floor-pf":
        with FloorSender(Producer({"bootstrap.servers": bootstrap, **KAFKA}),
                         redis.Redis.from_url(redis_url), topic, prefix) as sender:
            warm_up(sender.send, ready)
            schedule(sender.send, rate, count)
        return
    config = ProducerConfig(kafka={"bootstrap.servers": bootstrap, **KAFKA},
                            redis=RedisConfig(url=redis_url), mode=mode,
                            keyspace=KeySpace(prefix=prefix), default_ttl_s=TTL_MS // 1000)
    with GuardedProducer(config) as guarded:
        warm_up(lambda payload: guarded.send(topic, payload), ready)
        schedule(lambda payload: guarded.send(topic, payload), rate, count)
        guarded.flush(60)


def schedule(send: Any, rate: float, count: int) -> None:
    """Send ``count`` stamped messages, message k due at ``start + k / rate`` (open loop: a
    sender that falls behind sends at once, its lag counted in the latency)."""
    pad = b"x" * 192  # ~200-byte payloads, as in the other benchmarks
    start = time.time() + 0.2
    for k in range(count):
        due = start + k / rate
        if (ahead := due - time.time()) > 0:
            time.sleep(ahead)
        send(STAMP.pack(due) + pad)


def point(pipeline: str, bootstrap: str, redis_url: str, rate: float, seconds: float,
          trace: bool = False) -> tuple[list[float], TracedRun | None]:
    topic = make_topic(bootstrap, 4)
    prefix = f"lat{uuid.uuid4().hex[:6]}"
    count = max(1, int(rate * seconds))
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=consume, args=(pipeline, bootstrap, redis_url, prefix, topic,
                                             count, ready, out, trace))
    proc.start()
    send_all(pipeline, bootstrap, redis_url, prefix, topic, rate, count, ready)
    latencies, traced = out.get(timeout=600)
    proc.join(30)
    drop_keys(redis_url, prefix)
    return sorted(latencies), traced


def drop_keys(redis_url: str, prefix: str) -> None:
    """Delete what a point left under its fresh key prefix (eoguard's keys, the floors')."""
    client = redis.Redis.from_url(redis_url)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                client.unlink(*batch)
                batch = []
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


class RedisStalls:
    """Redis's own latency monitor around a point: its longest event (an AOF fsync under
    ``appendfsync always``, a fork) explains a tail no client-side timer can. Best effort:
    a Redis that refuses CONFIG SET reports nothing."""

    def __init__(self, redis_url: str, threshold_ms: int = 20) -> None:
        self.client = redis.Redis.from_url(redis_url)
        try:
            self.client.config_set("latency-monitor-threshold", threshold_ms)
            self.client.execute_command("LATENCY", "RESET")
            self.on = True
        except redis.RedisError:
            self.on = False

    def worst(self) -> tuple[str, dict[str, list[tuple[int, int]]]]:
        """``event max_ms`` per event seen since the start (LATENCY LATEST) or '', and each
        event's samples (LATENCY HISTORY: epoch s, ms); the client is closed."""
        try:
            if not self.on:
                return "", {}
            rows = self.client.execute_command("LATENCY", "LATEST")
            history = {}
            for row in rows:
                samples = self.client.execute_command("LATENCY", "HISTORY", row[0])
                history[reply_text(row[0])] = [(int(at), int(ms)) for at, ms in samples]
            return ", ".join(f"{reply_text(r[0])} max {int(r[3])} ms" for r in rows), history
        except redis.RedisError:
            return "", {}
        finally:
            self.client.close()


def callback_max_rate(bootstrap: str) -> float:
    """The callback baseline's msg/s: the producer suite's median when it ran in this process
    (``python -m bench``), else the median of three runs here. One run is too noisy a base:
    on a shared machine it moves by a third, and every load point moves with it."""
    measured = next((row.median for row in table.ROWS
                     if row.suite == "producer" and row.path == "baseline, callback"), None)
    if measured is not None:
        return measured
    topic = make_topic(bootstrap, 4)
    return statistics.median(30_000 / baseline(bootstrap, topic, 30_000, b"x" * 200,
                                               callback=True)[0] for _ in range(3))


def persist_first_max_rate(bootstrap: str, redis_url: str) -> float:
    """persist-first's own msg/s, as :func:`callback_max_rate` finds the baseline's."""
    measured = next((row.median for row in table.ROWS
                     if row.suite == "producer" and row.path == "persist-first"), None)
    if measured is not None:
        return measured
    topic = make_topic(bootstrap, 4)
    return statistics.median(30_000 / guarded(bootstrap, redis_url, topic, 30_000, b"x" * 200,
                                              "persist-first")[0] for _ in range(3))


def summary(lat: list[float]) -> str:
    text = (f"n={len(lat):6d}  p50 {percentile(lat, 0.5):7.1f} ms  "
            f"p99 {percentile(lat, 0.99):7.1f} ms")
    return text + (f"  p999 {percentile(lat, 0.999):7.1f} ms" if len(lat) >= 10_000 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per point")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--max-rate", type=float, help="the callback baseline's msg/s "
                        "(measured first when not given)")
    parser.add_argument("--redis-url", help="Redis for eoguard (default: the local stack's)")
    parser.add_argument("--trace", action="store_true", help="trace the eoguard consumers and "
                        "print where their tail messages spent their time")
    parser.add_argument("--split", action="store_true", help="also each side alone: the "
                        "GuardedProducer read by a plain loop, and GuardedConsumer reading "
                        "the plain producer")
    parser.add_argument("--persist-first-max-rate", type=float, help="persist-first's own "
                        "msg/s, for its point at 60%% of it (measured first when not given)")
    parser.add_argument("--points", nargs="+", choices=POINTS, default=list(POINTS),
                        help="which load points to run (default: all)")
    args = parser.parse_args()
    pipelines = PIPELINES + (SPLITS if args.split else ())
    ends, _ = LocalStack().up()
    redis_url = args.redis_url or ends.redis_url
    max_rate = args.max_rate or callback_max_rate(ends.kafka_bootstrap)
    own_rate = ((args.persist_first_max_rate or persist_first_max_rate(ends.kafka_bootstrap,
                                                                       redis_url))
                if "60% pf" in args.points else 0.0)
    rates = [("trickle", 50.0, pipelines), ("20%", 0.2 * max_rate, pipelines),
             ("60%", 0.6 * max_rate, pipelines),
             ("60% pf", 0.6 * own_rate, ("plain", "persist-first", "floor", "floor-pf"))]
    rates = [point for point in rates if point[0] in args.points]
    print(f"callback baseline max {max_rate:,.0f} msg/s; persist-first max {own_rate:,.0f} "
          f"msg/s ('60% pf' is 60% of it); {args.seconds:.0f} s per point; "
          f"{args.rounds} interleaved rounds; consumers {FETCH}; producers {KAFKA}")
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_no in range(1, args.rounds + 1):
        print(f"round {round_no} of {args.rounds}", flush=True)
        for label, rate, names in rates:
            for pipeline in names:
                stalls, busy = RedisStalls(redis_url), MachineCpu()
                lat, traced = point(pipeline, ends.kafka_bootstrap, redis_url, rate,
                                    args.seconds, args.trace)
                seen, history = stalls.worst()
                cpu = busy.share()
                found.setdefault((label, pipeline), []).append(
                    (percentile(lat, 0.5), percentile(lat, 0.99)))
                print(f"  {label:8s} {rate:8,.0f} msg/s  {pipeline:19s} {summary(lat)}"
                      + f"  cpu {cpu:4.0%}"
                      + (f"  [Redis stalls: {seen}]" if seen else ""), flush=True)
                if traced is not None:
                    print("\n".join(f"    {line}" for line in report(traced, seen, history)),
                          flush=True)
    print(f"\nover {args.rounds} rounds, ms: p50 and p99 as min / median / max; the difference "
          "to plain in the same round likewise, and each eoguard pipeline's to its floor")
    for label, rate, names in rates:
        plain = found[(label, "plain")]
        for pipeline in names:
            got = found[(label, pipeline)]
            p50s, p99s = [p for p, _ in got], [p for _, p in got]
            line = (f"{label:8s} {rate:8,.0f} msg/s  {pipeline:19s} p50 {_mm(p50s)}  "
                    f"p99 {_mm(p99s)}")
            if pipeline != "plain":
                line += f"   vs plain: {_minus(got, plain)}"
            if (floor := found.get((label, FLOORS.get(pipeline, "")))) is not None:
                line += (f"\n{'':38s}{pipeline} minus {FLOORS[pipeline]}: "
                         f"{_minus(got, floor)}")
            print(line, flush=True)
            table.add(table.Row(suite="latency", path=f"{pipeline} @ {label} ({rate:,.0f}/s)",
                                rates=[], e2e_ms=(statistics.median(p50s),
                                                  statistics.median(p99s)),
                                note=f"median of {args.rounds} rounds"))


def _minus(got: list[tuple[float, float]], base: list[tuple[float, float]]) -> str:
    """p50 and p99 of ``got`` minus those of ``base`` in the same round, as :func:`_mm`."""
    pairs = list(zip(got, base, strict=True))
    return (f"p50 {_mm([a[0] - b[0] for a, b in pairs], '+')}"
            f"  p99 {_mm([a[1] - b[1] for a, b in pairs], '+')}")


def _mm(values: list[float], sign: str = "") -> str:
    """min / median / max of ``values``; ``sign="+"`` for differences."""
    return (f"{min(values):{sign}.1f} / {statistics.median(values):{sign}.1f} / "
            f"{max(values):{sign}.1f}" if values else "-")

if __name__ == "__main__":
    main()
