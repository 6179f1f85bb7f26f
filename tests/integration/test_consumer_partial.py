"""A transactional handler whose effects fail midway (PARTIAL): dead-lettered, never re-applied.

The effect check in ``dedup_done.lua`` refuses what would fail before anything is written; what
it cannot foresee (here: an ACL that forbids SADD) fails after earlier effects were applied.
Redis cannot roll those back, so the message is marked done and the consumer dead-letters it
with the reason instead of retrying (a retry would apply the first effect again).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from eoguard.guard.consumer import GuardedConsumer
from eoguard.guard.handler import HandlerContext
from tests.consumer_kit import CODEC, consumer_config, drain, envelope, headers_of, produce, read_all

pytestmark = pytest.mark.integration


@pytest.fixture
def no_sadd_client(redis_client: redis.Redis, key_prefix: str) -> Iterator[redis.Redis]:
    user, password = f"eoguard-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    redis_client.acl_setuser(user, enabled=True, passwords=[f"+{password}"],
                             commands=["+@all", "-sadd"], keys=[f"{key_prefix}:*"])
    kwargs = redis_client.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0),
                         username=user, password=password)
    try:
        yield client
    finally:
        client.close()
        redis_client.acl_deluser(user)


def test_partial_effects_are_dead_lettered_once_and_the_rest_handled(
        no_sadd_client: redis.Redis, redis_client: redis.Redis, kafka_bootstrap: str,
        redis_url: str, key_prefix: str, new_topic) -> None:
    topic, dead = new_topic(1), new_topic(1, prefix="dlq")
    envs = [envelope(b"m%d" % i) for i in range(10)]
    poison = envs[4].id
    produce(kafka_bootstrap, topic, envs)
    counters: dict[str, str] = {}

    def handler(ctx: HandlerContext) -> None:
        counters[ctx.message_id] = ctx.key_for(f"count:{ctx.message_id}")
        ctx.tx.incr(counters[ctx.message_id])
        if ctx.message_id == poison:
            ctx.tx.sadd(ctx.key_for("tags"), "x")  # refused by the ACL, after the INCR

    config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                             dead_letter_topic=dead, ack_outbox=False)
    consumer = GuardedConsumer(config, handler=handler, redis=no_sadd_client)
    try:
        drain([consumer], lambda: consumer.stats().handled + consumer.stats().partial_effects
              >= len(envs))
        stats = consumer.stats()
    finally:
        consumer.close()
    letters = read_all(kafka_bootstrap, dead, 1)
    print(f"handled={stats.handled} partial={stats.partial_effects} retries={stats.retries} "
          f"dead letters={len(letters)}")
    assert (stats.handled, stats.partial_effects, stats.retries) == (9, 1, 0)
    assert len(letters) == 1
    headers = headers_of(letters[0])
    assert letters[0].value() == CODEC.encode(envs[4])
    assert "partial-effects" in headers.values()
    assert any("SADD" in value for value in headers.values())
    # Every counter once, the poison's included: its INCR was applied once and never again.
    assert {mid: redis_client.get(key) for mid, key in counters.items()} == \
        {e.id: b"1" for e in envs}
