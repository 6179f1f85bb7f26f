"""The header wire format against plain Schema Registry clients (a benchmark, not a test).

    python -m bench.bench_wire [--messages 20000] [--rounds 3] [--partitions 4]

Orders (``schemas/order.avsc``, about 90 bytes of Avro) through the local stack's Kafka, Redis
and Schema Registry, in ``--rounds`` interleaved rounds, each way to a fresh topic:

  producer  AvroSerializer          the baseline: plain confluent-kafka, idempotent, acks=all,
                                    the guarded producer's linger.ms, confluent-kafka's
                                    ``AvroSerializer`` in the loop, a delivery callback;
            headers, persist-first  GuardedProducer in the header format (the same bytes as
                                    the baseline's value, eoguard's fields as headers);
            envelope, persist-first GuardedProducer writing envelopes (the payload Avro too);
  consumer  AvroDeserializer        the baseline: a plain loop, ``AvroDeserializer`` per record;
            headers                 GuardedConsumer (no-op handler, outbox acks off) reading
                                    the header records (writer schema by id);
            envelope                the same reading the envelopes.

Timed from the first send to the last acknowledgement (producers) and from the poll that
brings the first record to the last record handled (consumers). Each path's ratio to its
suite's baseline is printed; the envelope's ratio beside the header format's is the
comparison the format is judged by.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bench import table
from eoguard.codec import SchemaRegistry
from eoguard.config import (
    ConsumerConfig,
    KeepUntil,
    ProducerConfig,
    RedisConfig,
    SchemaRegistryConfig,
    WireFormat,
)
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import LocalStack, create_topics
from eoguard.store.keys import KeySpace

ORDER = "eoguard.example.Order"
KAFKA = {"linger.ms": 5, "acks": "all", "enable.idempotence": True,
         "queue.buffering.max.messages": 500_000}
PRODUCERS = ("AvroSerializer", "headers, persist-first", "envelope, persist-first")
CONSUMERS = ("AvroDeserializer", "headers", "envelope")


def an_order(n: int) -> dict[str, Any]:
    return {"order_id": str(n), "customer": f"c{n % 97}", "amount": Decimal(f"{n % 1000}.25"),
            "currency": "EUR", "items": [{"sku": f"s{n % 31}", "qty": 1, "unit_price": 2.5}],
            "created_at": dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc),
            "express": n % 2 == 0, "attributes": {}, "note": None}


def topic_of(bootstrap: str, partitions: int) -> str:
    name = f"bench-wire-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


def baseline_producer(bootstrap: str, url: str, topic: str, orders: list[dict[str, Any]]
                      ) -> float:
    with SchemaRegistryClient({"url": url}) as client:
        serialize = AvroSerializer(
            client, json.dumps(SchemaRegistry.default().get(ORDER).schema))
        context = SerializationContext(topic, MessageField.VALUE)
        producer = Producer({"bootstrap.servers": bootstrap, **KAFKA})
        failed: list[object] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                failed.append(err)

        producer.produce(topic, serialize(orders[0], context))  # warm: registry, metadata
        producer.flush(30)
        started = time.perf_counter()
        for i, order in enumerate(orders):
            value = serialize(order, context)
            while True:
                try:
                    producer.produce(topic, value, b"k%d" % (i & 31), on_delivery=delivered)
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


def baseline_consumer(bootstrap: str, url: str, topic: str, total: int) -> float:
    with SchemaRegistryClient({"url": url}) as client:
        deserialize = AvroDeserializer(client)
        context = SerializationContext(topic, MessageField.VALUE)
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
                        deserialize(msg.value(), context)
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
            print(f"  round {r + 1}: {path:26s} {rates[path][-1]:10,.0f} msg/s", flush=True)
    return rates


def report(suite: str, paths: tuple[str, ...], rates: dict[str, list[float]], n: int) -> None:
    base = statistics.median(rates[paths[0]])
    for path in paths:
        median = statistics.median(rates[path])
        print(f"{suite:9s}{path:26s} min {min(rates[path]):9,.0f} median {median:9,.0f} "
              f"msg/s  {median / base:5.2f}x {paths[0]}")
        table.add(table.Row(suite=f"wire {suite}", path=path, rates=rates[path],
                            baseline=None if path == paths[0] else paths[0],
                            note=f"{n} orders"))


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
        if path == PRODUCERS[0]:
            return baseline_producer(ends.kafka_bootstrap, url, topic, orders)
        wire = WireFormat.HEADERS if path.startswith("headers") else WireFormat.ENVELOPE
        return guarded_producer(ends.kafka_bootstrap, ends.redis_url, url, topic, orders, wire)

    report("producer", PRODUCERS, interleaved(PRODUCERS, args.rounds, produce, n), n)
    sources = dict(zip(CONSUMERS, PRODUCERS, strict=True))

    def consume(path: str) -> float:
        topic = written[sources[path]]
        if path == CONSUMERS[0]:
            return baseline_consumer(ends.kafka_bootstrap, url, topic, n)
        return guarded_consumer(ends.kafka_bootstrap, ends.redis_url, url, topic, n)

    report("consumer", CONSUMERS, interleaved(CONSUMERS, args.rounds, consume, n), n)


if __name__ == "__main__":
    main()
