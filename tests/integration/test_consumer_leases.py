"""Claims outlive slow batches, and two readers of one scope never both handle a record.

Two GuardedConsumers of one scope in two groups read the same topic at once: each record is
claimed by one (its owner token names its group) and waited on by the other until done.
Batches take longer to handle than the claim lease, so only the lease renewal keeps the
other reader from taking the claims over and handling them a second time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from eoguard.guard.consumer import GuardedConsumer
from eoguard.guard.handler import HandlerContext
from tests.consumer_kit import consumer_config, envelope, produce

pytestmark = pytest.mark.integration

LEASE_S = 1.0
HANDLER_S = 0.06
BATCH = 30  # 30 x 0.06 s = 1.8 s per batch, longer than the lease


def test_two_readers_of_one_scope_with_slow_batches_handle_each_record_once(
        kafka_bootstrap: str, redis_url: str, key_prefix: str, new_topic: Any) -> None:
    topic = new_topic(2)
    envs = [envelope(b"slow %d" % i) for i in range(60)]
    produce(kafka_bootstrap, topic, envs)
    seen: dict[str, list[str]] = {"a": [], "b": []}
    consumers: dict[str, GuardedConsumer] = {}
    for name, record in seen.items():
        def handler(ctx: HandlerContext, out: list[str] = record) -> None:
            time.sleep(HANDLER_S)
            out.append(ctx.message_id)
        config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                                 scope="app", group=f"reader-{name}-{key_prefix}",
                                 lease_s=LEASE_S, busy_wait_s=20.0, batch_size=BATCH,
                                 dead_letter_topic=new_topic(1, prefix="dlq"))
        consumers[name] = GuardedConsumer(config, handler=handler)
    stop = threading.Event()

    def settled(c: GuardedConsumer) -> bool:
        stats = c.stats()
        done = stats.handled + stats.duplicates + stats.fenced + stats.busy_skipped
        return done >= len(envs) and stats.in_flight == 0

    def loop(c: GuardedConsumer) -> None:
        while not stop.is_set():
            c.poll_once()

    threads = [threading.Thread(target=loop, args=(c,)) for c in consumers.values()]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 90
        while not all(settled(c) for c in consumers.values()):
            assert time.monotonic() < deadline, {n: c.stats() for n, c in consumers.items()}
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        for c in consumers.values():
            c.close()
    stats = {name: c.stats() for name, c in consumers.items()}
    handled = Counter(seen["a"] + seen["b"])
    print(f"handled by a={len(seen['a'])} b={len(seen['b'])} distinct={len(handled)} "
          f"twice={sum(1 for n in handled.values() if n > 1)} renewals="
          f"{stats['a'].lease_renewals}+{stats['b'].lease_renewals} "
          f"busy waits={stats['a'].busy_waits}+{stats['b'].busy_waits}")
    assert handled == Counter(e.id for e in envs)  # every record once, none twice
    assert stats["a"].lease_renewals + stats["b"].lease_renewals > 0
    assert stats["a"].leases_lost + stats["b"].leases_lost == 0
    assert stats["a"].busy_skipped + stats["b"].busy_skipped == 0
