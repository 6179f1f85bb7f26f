"""Redis SIGKILLed mid-stream under a running GuardedConsumer, then restarted.

While Redis is down the consumer commits nothing and keeps retrying; once Redis is back it
resumes where it stopped: every message's Redis-side effect exists exactly once.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.consumer.state import ConsumerStats
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace
from tests.consumer_kit import committed_total, consumer_config
from tests.fault.consumer_fault_kit import (
    check_dedup_ttls,
    effect_counts,
    unique_group,
)

pytestmark = pytest.mark.fault


def done_count(stats: ConsumerStats) -> int:
    """Messages this consumer handled, or found done by itself when it read them again."""
    return stats.handled + stats.redelivered

MESSAGES, PARTITIONS = 4_000, 4


def test_redis_killed_mid_stream_nothing_lost_nothing_doubled(
        private_redis, new_topic, kafka_bootstrap, key_prefix) -> None:
    topic = new_topic(PARTITIONS)
    envs = [envelope(b"r%d" % i, ttl_ms=3_600_000) for i in range(MESSAGES)]
    produce(kafka_bootstrap, topic, envs)
    group, scope = unique_group("redis-down"), "rd"
    keys = KeySpace(prefix=key_prefix)
    handler_runs = 0

    def handler(ctx: HandlerContext) -> None:
        nonlocal handler_runs
        handler_runs += 1
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        ctx.tx.sadd(ctx.key_for("seen"), ctx.message_id)
        time.sleep(0.0005)

    config = consumer_config(kafka_bootstrap, private_redis.address, [topic], prefix=key_prefix,
                             scope=scope, group=group, batch_size=100,
                             retry_backoff_s=0.1, retry_backoff_max_s=1.0)
    consumer = GuardedConsumer(config, handler=handler)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    client = redis.Redis.from_url(private_redis.address)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while consumer.stats().handled < MESSAGES // 4:
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.01)
        private_redis.kill()  # SIGKILL, mid-stream
        killed_at = consumer.stats()
        time.sleep(1.0)
        committed_down, end = committed_total(kafka_bootstrap, group, topic, PARTITIONS)
        time.sleep(2.0)
        committed_later, _ = committed_total(kafka_bootstrap, group, topic, PARTITIONS)
        down = consumer.stats()
        private_redis.start()
        deadline = time.monotonic() + 120
        while done_count(consumer.stats()) < MESSAGES or committed_total(
                kafka_bootstrap, group, topic, PARTITIONS)[0] < end:
            assert time.monotonic() < deadline, f"did not resume: {consumer.stats()}"
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(30)
    seen, counts = effect_counts(client, keys, scope)
    final = consumer.stats()
    print(f"\nmessages {MESSAGES}; handled when Redis was killed {killed_at.handled}; "
          f"committed while down {committed_down} -> {committed_later} of {end}; outages seen "
          f"{down.store_outages}; handler runs {handler_runs}; handled {final.handled}; "
          f"redelivered after their done reply was lost {final.redelivered}; "
          f"effects {len(seen)}; counters {len(counts)} (not 1: "
          f"{sum(1 for n in counts.values() if n != 1)})")
    assert committed_later == committed_down < end  # nothing committed while Redis was down
    assert down.store_outages >= 1
    assert seen == {e.id for e in envs}  # no loss
    assert counts == {e.id: 1 for e in envs}  # no duplicate effect
    # A done mark Redis applied but whose reply the kill lost is found again as DONE_HERE (its batch is done).
    assert done_count(final) == MESSAGES
    assert final.duplicates == 0  # no message was sent twice: nothing is a duplicate
    check_dedup_ttls(client, keys, scope, envs[:: MESSAGES // 100], 300_000)
    client.close()


def test_redis_killed_with_a_round_trip_in_flight_rewinds_and_resumes(
        private_redis, new_topic, kafka_bootstrap, key_prefix) -> None:
    # Polled by hand until one batch is left to handle, every claim read. Redis is then
    # stopped (SIGSTOP) and killed 0.5 s later: the poll in between handles that batch and
    # sends its done marks, which Redis never answers. Their landing fails, and the rewind
    # must re-read the batches of a round trip whose landing already failed once (it raised
    # RuntimeError out of poll_once before the fix). A landing that waits on the stopped
    # Redis fails at the kill instead.
    topic = new_topic(2)
    scope = "rf"
    keys = KeySpace(prefix=key_prefix)

    def handler(ctx: HandlerContext) -> None:
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        ctx.tx.sadd(ctx.key_for("seen"), ctx.message_id)

    config = consumer_config(kafka_bootstrap, private_redis.address, [topic], prefix=key_prefix,
                             scope=scope, group=unique_group("in-flight"), batch_size=20,
                             retry_backoff_s=0.05, retry_backoff_max_s=0.2)
    consumer = GuardedConsumer(config, handler=handler)
    client = redis.Redis.from_url(private_redis.address)
    envs = [envelope(b"f%d" % i, ttl_ms=3_600_000) for i in range(100)]
    produce(kafka_bootstrap, topic, envs)
    try:
        deadline = time.monotonic() + 60
        pipe = consumer._pipe  # the state this test is about
        while not (consumer.stats().polled >= len(envs) and len(pipe._claimed) == 1
                   and not pipe._decoded and not any(f.claims for f in pipe._flights)):
            assert time.monotonic() < deadline, f"never got there: {consumer.stats()}"
            consumer.poll_once()
        before = consumer.stats().store_outages
        pid = private_redis.pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        killer = threading.Timer(0.5, private_redis.kill)
        killer.start()
        for _ in range(4):  # the first sends done marks never answered; none may raise
            consumer.poll_once()
        killer.join()
        failed_landings = consumer.stats().store_outages - before
        private_redis.start()
        deadline = time.monotonic() + 120
        while done_count(consumer.stats()) < len(envs):
            assert time.monotonic() < deadline, f"did not resume: {consumer.stats()}"
            consumer.poll_once()
    finally:
        consumer.close()
    seen, counts = effect_counts(client, keys, scope)
    final = consumer.stats()
    client.close()
    print(f"\nmessages {len(envs)}; rewinds after the kill {failed_landings}; "
          f"handled {final.handled}; redelivered {final.redelivered}; effects {len(seen)}; "
          f"counters {len(counts)} (not 1: {sum(1 for n in counts.values() if n != 1)})")
    assert failed_landings >= 1  # the path under test was taken
    assert seen == {e.id for e in envs}
    assert counts == {e.id: 1 for e in envs}
    assert done_count(final) == len(envs)
    assert final.duplicates == 0
