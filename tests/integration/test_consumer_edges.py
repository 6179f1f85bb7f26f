"""The edges of the dedup v2 model, end to end (real Kafka, real Redis).

Done flights lost with their connections; a dead-lettered record followed by a copy; a PARTIAL
record followed by a copy; offsets reset to latest and back; a topic deleted and recreated
under the same name; keys written per message; a trickle handled promptly. Each test checks
that nothing is lost and no effect applied twice, and prints the counts it checked.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import now_ms
from eoguard.stack import create_topics
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace
from tests.consumer_kit import CODEC, drain, headers_of, read_all

pytestmark = pytest.mark.integration


def counting(client: redis.Redis) -> tuple[dict[str, str], Any]:
    """A Redis-transactional handler that INCRs a counter per message id."""
    counters: dict[str, str] = {}

    def handler(ctx: HandlerContext) -> None:
        counters[ctx.message_id] = ctx.key_for(f"count:{ctx.message_id}")
        ctx.tx.incr(counters[ctx.message_id])
    return counters, handler


def values(client: redis.Redis, counters: dict[str, str]) -> Counter[int]:
    return Counter(int(v or 0) for v in client.mget(list(counters.values())))


def test_done_flights_lost_with_their_connections(make, new_topic, kafka_bootstrap,
                                                   redis_client: redis.Redis) -> None:
    topic = new_topic(1)
    envs = [envelope(b"f%d" % i) for i in range(2_000)]
    produce(kafka_bootstrap, topic, envs)
    counters, handler = counting(redis_client)
    consumer = make([topic], handler, batch_size=100, ack_outbox=False)
    kills = 0
    while len(counters) < len(envs) // 2:
        consumer.poll_once()
    for _ in range(3):  # done marks in flight, each time: their connections dropped
        for _ in range(2):
            consumer.poll_once()
        kills += redis_client.client_kill_filter(_type="normal", skipme=True)
    drain([consumer], lambda: len(counters) == len(envs) and consumer.stats().in_flight == 0)
    stats = consumer.stats()
    counts = values(redis_client, counters)
    print(f"connections killed {kills}; outages {stats.store_outages}; handled "
          f"{stats.handled}; re-read as done {stats.redelivered}; counters {dict(counts)}")
    assert kills > 0
    assert stats.store_outages > 0  # the lost flights were noticed and the batches re-read
    assert set(counters) == {e.id for e in envs}
    assert counts == Counter({1: len(envs)})  # every effect once


def test_a_dead_lettered_record_leaves_no_claim_and_a_later_copy_is_handled(
        make, new_topic, kafka_bootstrap, redis_client: redis.Redis, key_prefix: str) -> None:
    topic, dead = new_topic(1), new_topic(1, prefix="dlq")
    poison, other = envelope(b"poison"), envelope(b"other")
    produce(kafka_bootstrap, topic, [poison, other])
    handled: list[str] = []
    failing = {poison.id}

    def handler(ctx: HandlerContext) -> None:
        if ctx.message_id in failing:
            raise ValueError("not yet")
        handled.append(ctx.message_id)

    consumer = make([topic], handler, dead_letter_topic=dead, max_retries=1)
    drain([consumer], lambda: consumer.stats().dead_lettered >= 1 and other.id in handled)
    assert redis_client.exists(KeySpace(prefix=key_prefix).dedup("app", poison.id)) == 0
    failing.clear()  # the application is fixed; the record comes again (a copy)
    produce(kafka_bootstrap, topic, [poison])
    drain([consumer], lambda: poison.id in handled)
    letters = read_all(kafka_bootstrap, dead, 1)
    print(f"handled {handled}; dead letters {len(letters)}")
    assert handled == [other.id, poison.id]
    assert [CODEC.decode(m.value()).id for m in letters] == [poison.id]
    assert "handler-failed" in headers_of(letters[0]).values()


@pytest.mark.denied("-sadd")
def test_a_partial_record_followed_by_a_copy_is_not_applied_again(
        limited_client: redis.Redis, redis_client: redis.Redis, make, new_topic,
        kafka_bootstrap: str) -> None:
    topic, dead = new_topic(1), new_topic(1, prefix="dlq")
    poison = envelope(b"poison")
    produce(kafka_bootstrap, topic, [poison])
    counters: dict[str, str] = {}

    def handler(ctx: HandlerContext) -> None:
        counters[ctx.message_id] = ctx.key_for(f"count:{ctx.message_id}")
        ctx.tx.incr(counters[ctx.message_id])
        ctx.tx.sadd(ctx.key_for("tags"), "x")  # refused by the ACL, after the INCR

    consumer = make([topic], handler, dead_letter_topic=dead, ack_outbox=False,
                    redis=limited_client)
    drain([consumer], lambda: consumer.stats().partial_effects >= 1)
    produce(kafka_bootstrap, topic, [poison])  # a copy, at another offset
    drain([consumer], lambda: consumer.stats().duplicates >= 1)
    stats = consumer.stats()
    print(f"partial {stats.partial_effects}; duplicates {stats.duplicates}; handled "
          f"{stats.handled}; counter {redis_client.get(counters[poison.id])}")
    assert (stats.partial_effects, stats.duplicates, stats.handled) == (1, 1, 0)
    assert redis_client.get(counters[poison.id]) == b"1"  # applied once, never again


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def test_offsets_reset_to_latest_and_back(make, new_topic, kafka_bootstrap,
                                          redis_client: redis.Redis, key_prefix: str) -> None:
    topic = new_topic(2)
    first = [envelope(b"a%d" % i) for i in range(200)]
    produce(kafka_bootstrap, topic, first)
    counters, handler = counting(redis_client)
    group = f"reset-{key_prefix}"
    consumer = make([topic], handler, group=group, ack_outbox=False)
    drain([consumer], lambda: len(counters) == len(first))
    consumer.close()
    skipped = [envelope(b"s%d" % i) for i in range(50)]  # never read: reset to latest
    produce(kafka_bootstrap, topic, skipped)
    admin = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"w-{key_prefix}"})
    ends = {p: admin.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1)}
    admin.close()
    _commit(kafka_bootstrap, group, topic, ends)
    later = [envelope(b"l%d" % i) for i in range(50)]
    produce(kafka_bootstrap, topic, later)
    consumer = make([topic], handler, group=group, ack_outbox=False)
    drain([consumer], lambda: all(e.id in counters for e in later))
    consumer.close()
    _commit(kafka_bootstrap, group, topic, {0: 0, 1: 0})  # and back to the beginning
    consumer = make([topic], handler, group=group, ack_outbox=False)
    drain([consumer], lambda: consumer.stats().polled >= 300 and consumer.stats().in_flight == 0)
    stats = consumer.stats()
    counts = values(redis_client, counters)
    print(f"after the reset back: polled {stats.polled}, handled {stats.handled} (the skipped "
          f"ones), re-read as done {stats.redelivered}; counters {dict(counts)}")
    assert stats.handled == len(skipped)  # read for the first time now
    assert stats.redelivered == len(first) + len(later)  # DONE_HERE: same group, same offsets
    assert set(counters) == {e.id for e in [*first, *skipped, *later]}
    assert counts == Counter({1: len(counters)})


def test_a_topic_deleted_and_recreated_under_the_same_name(
        make, new_topic, kafka_bootstrap, redis_client: redis.Redis, key_prefix: str) -> None:
    topic = new_topic(1)
    old = [envelope(b"o%d" % i) for i in range(100)]
    produce(kafka_bootstrap, topic, old)
    counters, handler = counting(redis_client)
    group = f"recreate-{key_prefix}"
    consumer = make([topic], handler, group=group, ack_outbox=False)
    drain([consumer], lambda: len(counters) == len(old))
    consumer.close()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:  # the broker deletes the log asynchronously
        try:
            create_topics(kafka_bootstrap, {topic: 1})
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    # Offsets start over at 0: the same positions now hold new messages and copies of old ones
    # (a copy at its old offset, and copies at new offsets).
    new = [envelope(b"n%d" % i) for i in range(60)]
    records = [old[0], *new[:30], old[50], *new[30:], old[99]]
    produce(kafka_bootstrap, topic, records)
    _commit(kafka_bootstrap, group, topic, {0: 0})  # the group's old offset is past the new end
    consumer = make([topic], handler, group=group, ack_outbox=False)
    drain([consumer], lambda: all(e.id in counters for e in new)
          and consumer.stats().polled >= len(records) and consumer.stats().in_flight == 0)
    stats = consumer.stats()
    counts = values(redis_client, counters)
    print(f"after recreation: handled {stats.handled}, duplicates {stats.duplicates}, "
          f"re-read as done {stats.redelivered}; counters {dict(counts)}")
    assert stats.handled == len(new)
    assert stats.duplicates + stats.redelivered == 3
    assert counts == Counter({1: len(old) + len(new)})


def test_keys_written_per_message_at_steady_state(make, new_topic, kafka_bootstrap,
                                                  private_redis) -> None:
    # A Redis of this test alone: the server-wide command counts would otherwise include the
    # writes of tests running next to it (make test-fast runs them in parallel).
    redis_client = redis.Redis.from_url(private_redis.address)
    topic = new_topic(4)
    envs = [envelope(b"k%d" % i) for i in range(12_000)]
    produce(kafka_bootstrap, topic, envs)
    handled: list[str] = []

    def writes() -> int:
        stats = redis_client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items()
                   if k.removeprefix("cmdstat_") in ("set", "del", "pexpireat", "hset", "zadd",
                                                     "incrby", "expire", "pexpire", "hsetnx"))

    # Counted from before the consumer starts until nothing is in flight: every claim, batch
    # record, done mark, lease renewal and heartbeat of the run (read-ahead claims included).
    before = writes()
    consumer = make([topic], lambda ctx: handled.append(ctx.message_id), batch_size=500,
                    ack_outbox=False, redis=redis_client)
    drain([consumer], lambda: len(handled) >= len(envs) and consumer.stats().in_flight == 0)
    per_message = (writes() - before) / len(handled)
    print(f"keys written per message over {len(handled)} messages (batches of 500, 16 shards, "
          f"no outbox acks): {per_message:.3f}")
    assert len(handled) == len(envs)
    assert 1.0 <= per_message <= 1.1


def test_a_trickle_is_handled_promptly(make, new_topic, kafka_bootstrap) -> None:
    topic = new_topic(1)
    latencies: list[float] = []

    def handler(ctx: HandlerContext) -> None:
        latencies.append(now_ms() - ctx.envelope.created_at_ms)

    consumer = make([topic], handler, poll_timeout_s=1.0, kafka={"fetch.wait.max.ms": 100})
    consumer.poll_once()  # joined and assigned before the trickle starts
    count = 100

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "linger.ms": 0})
    producer.produce(topic, CODEC.encode(envelope(b"warm-up")))  # connected before timing
    producer.flush(30)
    count += 1

    def trickle() -> None:
        for i in range(count - 1):
            producer.produce(topic, CODEC.encode(envelope(b"t%d" % i)))  # created_at: now
            producer.poll(0)
            time.sleep(0.02)
        producer.flush(30)

    feeder = threading.Thread(target=trickle)
    feeder.start()
    drain([consumer], lambda: len(latencies) >= count, timeout_s=60)
    feeder.join()
    ordered = sorted(latencies)
    print(f"send -> handler over {count} messages at ~1 per 20 ms: p50 {ordered[count // 2]} ms, "
          f"p99 {ordered[int(count * 0.99)]} ms, max {ordered[-1]} ms")
    assert ordered[-1] < 1_000
