"""Consumers of one group racing over rebalances (join, leave): every message handled once."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack.feed import envelope, produce
from tests.consumer_kit import committed_total, consumer_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_consumers_racing_over_rebalances_handle_each_message_once(
        strategy, new_topic, kafka_bootstrap, redis_url, key_prefix) -> None:
    topic = new_topic(6)
    envs = [envelope(b"m%d" % i) for i in range(3_000)]
    resent = random.Random(7).sample(envs, 200)
    produce(kafka_bootstrap, topic, [*envs, *(e.with_attempt(2) for e in resent)])
    group = f"race-{strategy}-{uuid.uuid4().hex[:6]}"
    handled: list[str] = []
    lock = threading.Lock()

    def handler(ctx: HandlerContext) -> None:
        time.sleep(0.0005)  # slow enough that rebalances land while batches are in flight
        with lock:
            handled.append(ctx.message_id)

    def run(stop: threading.Event, stats: list) -> None:
        config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                                 group=group, batch_size=100, lease_s=20.0,
                                 kafka={"partition.assignment.strategy": strategy})
        consumer = GuardedConsumer(config, handler=handler)
        try:
            while not stop.is_set():
                consumer.poll_once()
        finally:
            consumer.close()  # lands the last done marks: they count as handled then
            stats.append(consumer.stats())

    stops = [threading.Event() for _ in range(3)]
    stats: list = []
    threads = [threading.Thread(target=run, args=(stop, stats), daemon=True) for stop in stops]

    def wait_for(count: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(handled) < count:
            assert time.monotonic() < deadline, f"stuck at {len(handled)} handled"
            time.sleep(0.01)

    threads[0].start()
    wait_for(400)
    threads[1].start()  # joins: partitions move from the first consumer
    wait_for(1_200)
    threads[2].start()  # another join
    wait_for(1_800)
    stops[0].set()  # the first leaves: its partitions move again
    threads[0].join(30)
    wait_for(len(envs))
    deadline = time.monotonic() + 60
    while (ends := committed_total(kafka_bootstrap, group, topic, 6))[0] < ends[1]:
        assert time.monotonic() < deadline, f"offsets not committed to the end: {ends}"
        time.sleep(0.2)
    time.sleep(0.5)  # anything still to (wrongly) handle twice would show up now
    for stop in stops[1:]:
        stop.set()
    for thread in threads[1:]:
        thread.join(30)
    counts = Counter(handled)
    doubled = {mid: n for mid, n in counts.items() if n > 1}
    print(f"[{strategy}] handled {len(handled)} of {len(envs)} messages "
          f"({len(resent)} resent); handled twice: {len(doubled)}; per consumer: "
          f"{[(s.handled, s.duplicates) for s in stats]}")
    assert doubled == {}
    assert set(counts) == {e.id for e in envs}
    assert sum(s.handled for s in stats) == len(envs)
    assert sum(s.duplicates for s in stats) >= len(resent)  # every resend was read and dropped
