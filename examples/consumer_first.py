"""Consumer-first adoption: a GuardedConsumer on a topic a plain Avro producer writes.

    python examples/consumer_first.py --topic plain-orders --count 20

The producer is what a team already runs, untouched: confluent-kafka's ``Producer`` with
``AvroSerializer`` (Schema Registry framing), no eoguard. It sends every order, then sends the
first half again, as a producer retrying after a timeout would. The GuardedConsumer reads
those records with ``plain_records``: ``AvroDeserializer`` for the value, the order id as the
business key (``id_from_field("orders", "order_id")``, the id a GuardedProducer would send it
under with ``message_id_for("orders", order_id)``) and an hour's lifetime from the record's
timestamp. Each order is handled once; the copies are dropped as duplicates. Moving the
producer to GuardedProducer later (same ids) needs no change here: docs/design.md §6,
"Plain topics".
"""

from __future__ import annotations

import json

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from stack_args import stack_parser, unique

from eoguard import (
    ConsumerConfig,
    GuardedConsumer,
    HandlerContext,
    KeySpace,
    Lifetime,
    PlainRecords,
    RedisConfig,
)
from eoguard.codec.plain import id_from_field

ORDER = json.dumps({"type": "record", "name": "PlainOrder", "namespace": "example",
                    "fields": [{"name": "order_id", "type": "string"},
                               {"name": "amount_cents", "type": "long"}]})


def produce_plain(bootstrap: str, registry: SchemaRegistryClient, topic: str, count: int) -> None:
    """The team's producer: Avro values, no eoguard; half the orders sent twice."""
    serialize = AvroSerializer(registry, ORDER)
    context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in [*range(count), *range(count // 2)]:
        order = {"order_id": f"p-{i}", "amount_cents": i * 100 + 50}
        producer.produce(topic, key=order["order_id"], value=serialize(order, context))
    if producer.flush(30):
        raise RuntimeError("records left undelivered")


def consume(config: ConsumerConfig, records: int) -> GuardedConsumer:
    """Handle ``records`` records (handled, dropped as duplicates or dead-lettered), then stop."""
    def handle(ctx: HandlerContext) -> None:  # ctx.payload: the deserialized value
        ctx.tx.incr(ctx.key_for("revenue_cents"), ctx.payload["amount_cents"])
        ctx.tx.sadd(ctx.key_for("orders"), ctx.payload["order_id"])

    consumer = GuardedConsumer(config, handler=handle)
    def finished() -> bool:
        stats = consumer.stats()
        return stats.handled + stats.duplicates + stats.dead_lettered >= records

    consumer.run(finished)  # closes the consumer when it returns
    return consumer


def main(argv: list[str] | None = None) -> int:
    parser = stack_parser(__doc__.split("\n")[0])
    parser.set_defaults(topic="plain-orders")
    parser.add_argument("--count", type=int, default=20, help="orders p-0 .. p-<count-1>")
    parser.add_argument("--group", default=unique("billing"), help="Kafka consumer group")
    parser.add_argument("--scope", default="billing", help="the dedup scope")
    args = parser.parse_args(argv)
    with SchemaRegistryClient({"url": args.registry}) as registry:
        produce_plain(args.bootstrap, registry, args.topic, args.count)
        deserialize = AvroDeserializer(registry)
        context = SerializationContext(args.topic, MessageField.VALUE)
        plain = PlainRecords(deserializer=lambda raw: deserialize(raw, context),
                             id_rule=id_from_field("orders", "order_id"),
                             lifetime=Lifetime(ttl_s=3600))
        config = ConsumerConfig(
            kafka={"bootstrap.servers": args.bootstrap, "group.id": args.group},
            redis=RedisConfig(url=args.redis), scope=args.scope, topics=(args.topic,),
            keyspace=KeySpace(prefix=args.prefix), plain_records=plain, poll_timeout_s=0.2)
        stats = consume(config, records=args.count + args.count // 2).stats()
    print(f"handled {stats.handled}, duplicates {stats.duplicates}, "
          f"dead-lettered {stats.dead_lettered}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
