"""The consumer side of asgi_orders.py: each order charged once, by an async handler.

An AsyncGuardedConsumer reads the orders the service of ``asgi_orders.py`` guaranteed and
awaits, for each, a call to the payment gateway (simulated here: ``--charge-ms`` of I/O)
with the message id as its idempotency key; then it records the order in Redis through
``ctx.tx``, applied with the order's done mark: exactly once, whatever crashes. Up to
``--concurrency`` orders are charged at once, never two of one order id at once (the
service keys each record by its order id), and a charge that hangs past ``--timeout-s`` is
retried. SIGINT or SIGTERM cancels the run: the batch in flight is finished, the rest given
back to the group::

    python examples/asgi_orders_consumer.py --bootstrap 127.0.0.1:19092 \\
        --redis redis://127.0.0.1:16379/0 --topic orders --group billing

Per order (its message id ``mid``, ``message_id_for("orders", order_id)``) it writes the hash
``...:charged:<mid>`` (``order_id``, ``amount``) and counts the charge in ``...:charges:<mid>``
(``ctx.key_for``: keys in the message's hash slot). It prints "ready", then "charged
<order_id>" per order, and "stopped" with its counters at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Awaitable, Callable

from stack_args import stack_parser

from eoguard import AsyncGuardedConsumer, ConsumerConfig, HandlerContext, KeySpace, RedisConfig


async def charge(order: dict[str, object], idempotency_key: str, *, charge_ms: float) -> None:
    """The payment gateway's call (simulated): it charges once per idempotency key."""
    await asyncio.sleep(charge_ms / 1000)


def handler(charge_ms: float) -> Callable[[HandlerContext], Awaitable[None]]:
    """The async handler: charge the order, then record it with its done mark."""
    async def handle(ctx: HandlerContext) -> None:
        order = json.loads(ctx.payload)
        await charge(order, ctx.message_id, charge_ms=charge_ms)
        mid = ctx.message_id
        ctx.tx.hset(ctx.key_for(f"charged:{mid}"), {"order_id": str(order["order_id"]),
                                                    "amount": str(order.get("amount", ""))})
        ctx.tx.incr(ctx.key_for(f"charges:{mid}"))
        print(f"charged {order['order_id']}", flush=True)
    return handle


async def consume(config: ConsumerConfig, *, concurrency: int, timeout_s: float,
                  charge_ms: float) -> None:
    """Charge orders until SIGINT or SIGTERM."""
    async with AsyncGuardedConsumer(config, handler=handler(charge_ms), concurrency=concurrency,
                                    keep_key_order=True, handler_timeout_s=timeout_s) as consumer:
        running = asyncio.ensure_future(consumer.run())
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, running.cancel)
        print("ready", flush=True)
        with contextlib.suppress(asyncio.CancelledError):  # SIGINT, SIGTERM
            await running
        print(f"stopped {consumer.stats()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = stack_parser(__doc__.split("\n")[0])
    parser.add_argument("--group", required=True, help="the Kafka consumer group")
    parser.add_argument("--scope", default="billing", help="the dedup scope")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--charge-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    config = ConsumerConfig(kafka={"bootstrap.servers": args.bootstrap, "group.id": args.group},
                            redis=RedisConfig(url=args.redis), scope=args.scope,
                            topics=(args.topic,), keyspace=KeySpace(prefix=args.prefix))
    asyncio.run(consume(config, concurrency=args.concurrency, timeout_s=args.timeout_s,
                        charge_ms=args.charge_ms))


if __name__ == "__main__":
    main()
