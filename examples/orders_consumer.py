"""Handle orders with a GuardedConsumer: each order's effects land once per scope.

    python examples/orders_consumer.py --group billing --scope billing

Reads what examples/orders_producer.py sends. Per order the handler adds the amount to a
revenue counter (in cents) and the order id to a set, both through ``ctx.tx``: they are applied in one
Redis transaction with the order's done mark, so a crash before it leaves no effect and the
order is handled again, and a copy (sent again, read again) is dropped. Runs until Ctrl-C, or
with ``--records N`` until N records were handled, dropped as duplicates or dead-lettered.
"""

from __future__ import annotations

import contextlib
import json
from decimal import Decimal

from stack_args import stack_parser, unique

from eoguard import ConsumerConfig, GuardedConsumer, HandlerContext, KeySpace, RedisConfig


def handle(ctx: HandlerContext) -> None:
    order = json.loads(ctx.payload)
    ctx.tx.incr(ctx.key_for("revenue_cents"), int(Decimal(order["amount"]) * 100))
    ctx.tx.sadd(ctx.key_for("orders"), order["order_id"])


def main(argv: list[str] | None = None) -> int:
    parser = stack_parser(__doc__.split("\n")[0])
    parser.add_argument("--group", default=unique("billing"), help="Kafka consumer group")
    parser.add_argument("--scope", default="billing", help="the dedup scope")
    parser.add_argument("--records", type=int, default=0, help="stop after this many; 0: never")
    args = parser.parse_args(argv)
    config = ConsumerConfig(
        kafka={"bootstrap.servers": args.bootstrap, "group.id": args.group},
        redis=RedisConfig(url=args.redis), scope=args.scope, topics=(args.topic,),
        keyspace=KeySpace(prefix=args.prefix), poll_timeout_s=0.2)
    consumer = GuardedConsumer(config, handler=handle)

    def finished() -> bool:
        stats = consumer.stats()
        return bool(0 < args.records <= stats.handled + stats.duplicates + stats.dead_lettered)

    with contextlib.suppress(KeyboardInterrupt):
        consumer.run(finished)  # closes the consumer when it returns
    stats = consumer.stats()
    print(f"handled {stats.handled}, duplicates {stats.duplicates}, "
          f"dead-lettered {stats.dead_lettered}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
