"""An AsyncGuardedConsumer process for the async crash test: a Redis-transactional async handler.

    python async_consumer_worker.py BOOTSTRAP REDIS_URL TOPIC PREFIX SCOPE GROUP MEMBER

Per message the ``async def`` handler INCRs a per-id counter and SADDs the id to a per-shard
"seen" set, both through ctx.tx (applied with the done mark), and awaits up to 10 ms of
"I/O"; eight run at once, in key order. It prints "batch <n>" every 50 handler calls (the test
kills it after one) and runs until SIGTERM, which cancels ``run()``: the batch in flight is
finished, the rest given back, and it prints "stopped". ``MEMBER`` is its static group
member id: a restart takes the member over at once. Fenced by Kafka for good
(ConsumerFencedError), it prints "fenced <error>" and exits with code 3.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys

from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.aio import AsyncGuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.errors import ConsumerFencedError
from eoguard.store.keys import KeySpace


async def main() -> None:
    bootstrap, redis_url, topic, prefix, scope, group, member = sys.argv[1:8]
    calls = 0

    async def handle(ctx: HandlerContext) -> None:
        nonlocal calls
        calls += 1
        if calls % 50 == 0:
            print(f"batch {calls // 50}", flush=True)
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        ctx.tx.sadd(ctx.key_for("seen"), ctx.message_id)
        await asyncio.sleep(random.uniform(0.0, 0.01))  # kills land inside the handlers

    config = ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": group,
               "group.instance.id": f"{group}-{member}", "session.timeout.ms": 6000},
        redis=RedisConfig(url=redis_url), scope=scope, topics=(topic,), batch_size=200,
        poll_timeout_s=0.2, lease_s=10.0, keyspace=KeySpace(prefix=prefix))
    async with AsyncGuardedConsumer(config, handler=handle, concurrency=8,
                                    keep_key_order=True, handler_timeout_s=5.0) as consumer:
        print("ready", flush=True)
        running = asyncio.ensure_future(consumer.run())
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, running.cancel)
        try:
            await running
        except asyncio.CancelledError:
            pass
        except ConsumerFencedError as exc:
            print(f"fenced {exc}", flush=True)
            sys.exit(3)
        print(f"stopped {consumer.stats()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
