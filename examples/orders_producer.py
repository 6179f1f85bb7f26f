"""Send orders with a GuardedProducer: each is guaranteed once it is in the Redis outbox.

    python -m eoguard.stack up
    python examples/orders_producer.py --count 100

Every order is sent under ``message_id_for("orders", <order id>)``, so running this again
sends the same messages: while the first run's outbox records are there, they are not
published again; once consumers (examples/orders_consumer.py) have acknowledged them, they
are, and every consumer scope drops them as duplicates.
``on_guaranteed`` fires per order once no crash of this process can lose it (persist-first:
the outbox holds it; a restarted producer resends what its predecessor left there).
"""

from __future__ import annotations

import json

from stack_args import stack_parser

from eoguard import GuardedProducer, KeySpace, ProducerConfig, RedisConfig, message_id_for


def main(argv: list[str] | None = None) -> int:
    parser = stack_parser(__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100, help="orders o-0 .. o-<count-1>")
    args = parser.parse_args(argv)
    config = ProducerConfig(kafka={"bootstrap.servers": args.bootstrap},
                            redis=RedisConfig(url=args.redis),
                            keyspace=KeySpace(prefix=args.prefix))
    guaranteed: list[str] = []
    with GuardedProducer(config, on_guaranteed=lambda h: guaranteed.append(h.id)) as producer:
        for i in range(args.count):
            order = {"order_id": f"o-{i}", "amount": f"{i}.50"}
            producer.send(args.topic, json.dumps(order).encode(), key=order["order_id"],
                          message_id=message_id_for("orders", order["order_id"]))
    # leaving the block closed the producer: every send is guaranteed or has failed
    print(f"guaranteed {len(guaranteed)} of {args.count}")
    return 0 if len(guaranteed) == args.count else 1


if __name__ == "__main__":
    raise SystemExit(main())
