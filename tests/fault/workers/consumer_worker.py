"""A GuardedConsumer process for the crash test: a Redis-transactional batch handler.

    python consumer_worker.py BOOTSTRAP REDIS_URL TOPIC PREFIX SCOPE GROUP [MEMBER]

Per message the handler INCRs a per-id counter and SADDs the id to a per-shard "seen" set,
both through ctx.tx (applied with the done mark). It prints "batch <n>" before each batch it
handles (the test kills it right after, or at random times) and runs until SIGTERM. Fenced
by Kafka for good (ConsumerFencedError), it prints "fenced <error>" and exits with code 3, for
its supervisor (the test) to start a new one. ``MEMBER`` (default ``worker``) names its
static group member: workers side by side in one group need one each. It uses only API every
release since c04753f has (tests/integration/test_rolling_upgrade.py runs it on that one).
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time

from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.errors import ConsumerFencedError
from eoguard.store.keys import KeySpace


def main() -> None:
    bootstrap, redis_url, topic, prefix, scope, group = sys.argv[1:7]
    member = sys.argv[7] if len(sys.argv) > 7 else "worker"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    batches = 0

    def handle(contexts):
        nonlocal batches
        batches += 1
        print(f"batch {batches} {len(contexts)}", flush=True)
        for ctx in contexts:
            ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
            ctx.tx.sadd(ctx.key_for("seen"), ctx.message_id)
            if random.random() < 0.01:
                time.sleep(0.005)
        time.sleep(random.uniform(0.0, 0.03))  # a slow handler: kills land inside batches

    config = ConsumerConfig(
        kafka={"bootstrap.servers": bootstrap, "group.id": group,
               "group.instance.id": f"{group}-{member}",  # a restart takes the member over at once
               "session.timeout.ms": 6000},
        redis=RedisConfig(url=redis_url), scope=scope, topics=(topic,), batch_size=200,
        poll_timeout_s=0.2, lease_s=10.0, keyspace=KeySpace(prefix=prefix))
    consumer = GuardedConsumer(config, batch_handler=handle)
    print("ready", flush=True)
    try:
        consumer.run(stop)
    except ConsumerFencedError as exc:
        print(f"fenced {exc}", flush=True)
        sys.exit(3)
    print(f"stopped {consumer.stats()}", flush=True)


if __name__ == "__main__":
    main()
