"""The header wire format against plain Schema Registry clients (a benchmark, not a test).

    python -m bench.bench_wire [--messages 20000] [--rounds 3] [--partitions 4]

Orders (``schemas/order.avsc``, about 90 bytes of Avro) through the local stack's Kafka, Redis
and Schema Registry, in ``--rounds`` interleaved rounds, each way to a fresh topic:

  producer  AvroSerializer          the baseline: plain confluent-kafka, idempotent, acks=all,
                                    the guarded producer's linger.ms, confluent-kafka's
                                    ``AvroSerializer`` in the loop, a delivery callback;
            AvroSerializer + CloudEvents headers
                                    the same, each record with the nine headers the header
                                    format carries, built per record by plain code (a uuid4,
                                    two RFC 3339 times): what a user writing CloudEvents
                                    binary-mode records pays without eoguard;
            envelope, plain fastavro
                                    the envelope's own baseline (bench_producer's): the Order
                                    as Avro bytes in eoguard's envelope, written by fastavro;
            headers, persist-first  GuardedProducer in the header format (the same bytes as
                                    the baseline's value, eoguard's fields as headers);
            envelope, persist-first GuardedProducer writing envelopes (the payload Avro too);
  consumer  AvroDeserializer        the baseline: a plain loop, ``AvroDeserializer`` per record;
            AvroDeserializer + CloudEvents headers
                                    the same over the CloudEvents records above, reading each
                                    record's headers and dropping it once ``ce_expirytime``
                                    passed (the header format's own baseline);
            envelope, plain fastavro
                                    bench_consumer's plain loop over the plain envelopes
                                    (expired ones dropped), the Order then read by fastavro;
            headers                 GuardedConsumer (no-op handler, outbox acks off) reading
                                    the header records (writer schema by id);
            envelope                the same reading the envelopes.

Timed from the first send to the last acknowledgement (producers) and from the poll that
brings the first record to the last record handled (consumers). Each path's ratio to its
suite's baseline is printed; the envelope's ratio beside the header format's is the
comparison the format is judged by. Then each format against the baseline that writes the
same fields without eoguard (its own): headers against ``AvroSerializer + CloudEvents
headers``, the envelope against ``envelope, plain fastavro``, on both sides.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import statistics
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import fastavro
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bench import table
from bench.bench_consumer import plain_decode
from bench.bench_producer import PlainEncoder
from eoguard.codec import SchemaRegistry
from eoguard.config import (
    ConsumerConfig,
    KeepUntil,
    ProducerConfig,
    RedisConfig,
    SchemaRegistryConfig,
    WireFormat,
)
from eoguard.config.services import REGISTRY_TIMEOUT_S
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import LocalStack, create_topics
from eoguard.store.keys import KeySpace

ORDER = "eoguard.example.Order"
KAFKA = {"linger.ms": 5, "acks": "all", "enable.idempotence": True,
         "queue.buffering.max.messages": 500_000}
PRODUCERS = ("AvroSerializer", "AvroSerializer + CloudEvents headers",
             "envelope, plain fastavro", "headers, persist-first", "envelope, persist-first")
CONSUMERS = ("AvroDeserializer", "AvroDeserializer + CloudEvents headers",
             "envelope, plain fastavro", "headers", "envelope")
SOURCES = dict(zip(CONSUMERS, PRODUCERS, strict=True))
"""Which producer path's topic each consumer path reads (the same place in its tuple)."""
OWN_BASELINES = ((3, 1), (4, 2))
"""Each format's path and the plain path writing or reading the same fields, by index."""


def an_order(n: int) -> dict[str, Any]:
    return {"order_id": str(n), "customer": f"c{n % 97}", "amount": Decimal(f"{n % 1000}.25"),
            "currency": "EUR", "items": [{"sku": f"s{n % 31}", "qty": 1, "unit_price": 2.5}],
            "created_at": dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc),
            "express": n % 2 == 0, "attributes": {}, "note": None}


def topic_of(bootstrap: str, partitions: int) -> str:
    name = f"bench-wire-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


def cloudevents_headers(schema: str) -> Callable[[], list[tuple[str, bytes]]]:
    """The nine headers of the header format, as plain code writes them per record."""
    def headers() -> list[tuple[str, bytes]]:
        now = dt.datetime.now(dt.timezone.utc)
        expiry = now + dt.timedelta(hours=1)
        return [("ce_specversion", b"1.0"), ("ce_id", str(uuid.uuid4()).encode()),
                ("ce_time", now.isoformat(timespec="milliseconds").encode()),
                ("ce_expirytime", expiry.isoformat(timespec="milliseconds").encode()),
                ("ce_source", b"/bench"), ("ce_type", schema.encode()),
                ("ce_eoguardattempt", b"1"), ("ce_eoguardproducer", b"bench-1"),
                ("content-type", b"application/avro")]
    return headers


def baseline_producer(bootstrap: str, url: str, topic: str, orders: list[dict[str, Any]],
                      path: str = PRODUCERS[0]) -> float:
    """A plain producer's seconds for ``orders``: ``path`` is one of the first three."""
    with SchemaRegistryClient({"url": url, "timeout": REGISTRY_TIMEOUT_S}) as client:
        serialize = AvroSerializer(
            client, json.dumps(SchemaRegistry.default().get(ORDER).schema))
        context = SerializationContext(topic, MessageField.VALUE)
        if path == PRODUCERS[2]:  # Avro bytes in eoguard's envelope, both by fastavro
            order_schema = fastavro.parse_schema(SchemaRegistry.default().get(ORDER).schema)
            envelope = PlainEncoder("bench-wire")
            buffer = io.BytesIO()

            def record(order: dict[str, Any]) -> tuple[bytes, list[tuple[str, bytes]] | None]:
                buffer.seek(0)
                buffer.truncate()
                fastavro.schemaless_writer(buffer, order_schema, order)
                return envelope.encode(buffer.getvalue(), 3_600_000), None
        elif path == PRODUCERS[1]:
            make_headers = cloudevents_headers(ORDER)

            def record(order: dict[str, Any]) -> tuple[bytes, list[tuple[str, bytes]] | None]:
                return serialize(order, context), make_headers()
        else:
            def record(order: dict[str, Any]) -> tuple[bytes, list[tuple[str, bytes]] | None]:
                return serialize(order, context), None
        producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
        failed: list[object] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                failed.append(err)

        value, headers = record(orders[0])
        producer.produce(topic, value, headers=headers)  # warm: registry, metadata
        producer.flush(30)
        started = time.perf_counter()
        for i, order in enumerate(orders):
            value, headers = record(order)
            while True:
                try:
                    producer.produce(topic, value, b"k%d" % (i & 31), on_delivery=delivered,
                                     headers=headers)
                    break
                except BufferError:
                    producer.poll(0.001)
            if i & 1023 == 0:
                producer.poll(0)
        assert producer.flush(120) == 0
        assert not failed, failed[:3]
        return time.perf_counter() - started


def guarded_producer(bootstrap: str, redis_url: str, url: str, topic: str,
                     orders: list[dict[str, Any]], wire: WireFormat) -> float:
    config = ProducerConfig(kafka={"bootstrap.servers": bootstrap, **KAFKA},
                            redis=RedisConfig(url=redis_url), wire_format=wire,
                            schema_registry=SchemaRegistryConfig(url=url),
                            keyspace=KeySpace(prefix=f"bench{uuid.uuid4().hex[:6]}"),
                            default_ttl_s=3600, keep_until=KeepUntil.PUBLISHED,
                            max_queue_messages=200_000, max_queue_bytes=256 * 1024 * 1024)
    with GuardedProducer(config) as producer:
        producer.send(topic, orders[0], schema=ORDER)  # warm: registry, scripts, metadata
        producer.flush(30)
        started = time.perf_counter()
        for i, order in enumerate(orders):
            producer.send(topic, order, key=b"k%d" % (i & 31), schema=ORDER)
        assert producer.flush(120) == 0
        return time.perf_counter() - started


def baseline_consumer(bootstrap: str, url: str, topic: str, total: int,
                      path: str = CONSUMERS[0]) -> float:
    """A plain consumer's seconds for ``total`` records: ``path`` is one of the first three."""
    with SchemaRegistryClient({"url": url, "timeout": REGISTRY_TIMEOUT_S}) as client:
        deserialize = AvroDeserializer(client)
        context = SerializationContext(topic, MessageField.VALUE)
        order_schema = fastavro.parse_schema(SchemaRegistry.default().get(ORDER).schema)

        def read(msg: Message) -> object:
            if path == CONSUMERS[2]:
                env = plain_decode(msg.value())
                return None if env is None else fastavro.schemaless_reader(
                    io.BytesIO(env["payload"]), order_schema, None)
            if path == CONSUMERS[1]:
                fields = dict(msg.headers() or ())
                expiry = dt.datetime.fromisoformat(fields["ce_expirytime"].decode())
                dt.datetime.fromisoformat(fields["ce_time"].decode())
                if expiry <= dt.datetime.now(dt.timezone.utc):
                    return None
            return deserialize(msg.value(), context)

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic])
        seen, started = 0, 0.0
        try:
            while seen < total:
                polled = time.perf_counter()  # the first batch's wait is counted, as below
                msgs = consumer.consume(1000, 1.0)
                if msgs and not started:
                    started = polled
                for msg in msgs:
                    if msg.error() is None:
                        read(msg)
                        seen += 1
                if msgs:
                    consumer.commit(asynchronous=True)
            return time.perf_counter() - started
        finally:
            consumer.close()


def guarded_consumer(bootstrap: str, redis_url: str, url: str, topic: str, total: int
                     ) -> float:
    config = ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4().hex[:8]}"},
        redis=RedisConfig(url=redis_url), scope=f"bench-{uuid.uuid4().hex[:6]}",
        topics=(topic,), batch_size=1000, ack_outbox=False,
        keyspace=KeySpace(prefix=f"bench{uuid.uuid4().hex[:6]}"),
        schema_registry=SchemaRegistryConfig(url=url))
    with GuardedConsumer(config, handler=lambda ctx: None) as consumer:
        started = 0.0
        while consumer.stats().handled < total:
            polled = time.perf_counter()  # before the poll: it reads ahead and decodes
            if consumer.poll_once() and not started:
                started = polled
        return time.perf_counter() - started


def interleaved(paths: tuple[str, ...], rounds: int, run: Callable[[str], float], n: int
                ) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {p: [] for p in paths}
    for r in range(rounds):
        for path in paths[r % len(paths):] + paths[:r % len(paths)]:
            rates[path].append(n / run(path))
            print(f"  round {r + 1}: {path:38s} {rates[path][-1]:10,.0f} msg/s", flush=True)
    return rates


def report(suite: str, paths: tuple[str, ...], rates: dict[str, list[float]], n: int) -> None:
    base = statistics.median(rates[paths[0]])
    for path in paths:
        median = statistics.median(rates[path])
        print(f"{suite:9s}{path:38s} min {min(rates[path]):9,.0f} median {median:9,.0f} "
              f"msg/s  {median / base:5.2f}x {paths[0]}")
        table.add(table.Row(suite=f"wire {suite}", path=path, rates=rates[path],
                            baseline=None if path == paths[0] else paths[0],
                            note=f"{n} orders"))


def own_baselines(suite: str, paths: tuple[str, ...], rates: dict[str, list[float]]) -> None:
    """Each format against the plain path that writes or reads the same fields."""
    for mine, own in OWN_BASELINES:
        ratio = statistics.median(rates[paths[mine]]) / statistics.median(rates[paths[own]])
        print(f"{suite:9s}{paths[mine]:38s} {ratio:5.2f}x {paths[own]} (its own baseline)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    ends, _ = LocalStack().up()
    url = ends.schema_registry_url
    assert url is not None, "the stack has no Schema Registry"
    n = args.messages
    orders = [an_order(i) for i in range(n)]
    print(f"{n} orders x {args.rounds} interleaved rounds, {args.partitions} partitions; "
          f"librdkafka {KAFKA}; registry {url}")
    written: dict[str, str] = {}  # the consumers read what the producers' last round wrote

    def produce(path: str) -> float:
        topic = written[path] = topic_of(ends.kafka_bootstrap, args.partitions)
        if path in PRODUCERS[:3]:
            return baseline_producer(ends.kafka_bootstrap, url, topic, orders, path)
        wire = WireFormat.HEADERS if path.startswith("headers") else WireFormat.ENVELOPE
        return guarded_producer(ends.kafka_bootstrap, ends.redis_url, url, topic, orders, wire)

    produced = interleaved(PRODUCERS, args.rounds, produce, n)
    report("producer", PRODUCERS, produced, n)
    own_baselines("producer", PRODUCERS, produced)

    def consume(path: str) -> float:
        topic = written[SOURCES[path]]
        if path in CONSUMERS[:3]:
            return baseline_consumer(ends.kafka_bootstrap, url, topic, n, path)
        return guarded_consumer(ends.kafka_bootstrap, ends.redis_url, url, topic, n)

    consumed = interleaved(CONSUMERS, args.rounds, consume, n)
    report("consumer", CONSUMERS, consumed, n)
    own_baselines("consumer", CONSUMERS, consumed)


if __name__ == "__main__":
    main()
