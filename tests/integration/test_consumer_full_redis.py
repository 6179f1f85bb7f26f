"""A full Redis (maxmemory reached under ``noeviction``) as a consumer marks a batch done with
Redis-side effects: a retry, never a failure of the message (docs/design.md §1, §4: "A full
Redis (OOM under noeviction) is StoreOutOfMemoryError").

Found by the chaos suite (single seed 1, full mode: ``redis-oom`` over a consumer scope): a
valid, guaranteed message was dead-lettered as "failed 3 times" with
``StoreError("Redis effects refused: HINCRBY ... failed: OOM command not allowed when used
memory > 'maxmemory'.; nothing applied")`` and never handled. The done script answers
EFFECT_ERROR when an effect's first write fails, the consumer counts EFFECT_ERROR as a failed
attempt of the message, and ``max_retries`` such attempts dead-letter it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack.feed import envelope, produce
from eoguard.stack.redis_server import RedisServer
from tests.consumer_kit import consumer_config

pytestmark = pytest.mark.integration


def two_retries(kafka_bootstrap: str, private_redis: RedisServer, topic: str,
                new_topic: Callable[..., str], key_prefix: str,
                handler: Callable[[HandlerContext], None], *,
                backoff_s: tuple[float, float]) -> GuardedConsumer:
    """A consumer of ``topic`` on the private Redis that dead-letters a message after two
    retries, ``backoff_s`` (first, most) apart."""
    config = consumer_config(kafka_bootstrap, private_redis.address, [topic], prefix=key_prefix,
                             dead_letter_topic=new_topic(1, prefix="dlq"), max_retries=2,
                             retry_backoff_s=backoff_s[0], retry_backoff_max_s=backoff_s[1])
    return GuardedConsumer(config, handler=handler)


def test_a_done_mark_refused_for_memory_is_retried_not_dead_lettered(
        kafka_bootstrap: str, private_redis: RedisServer, new_topic: Callable[..., str],
        key_prefix: str) -> None:
    """The first three times the handler runs (its claim made; ``max_retries`` is 2), Redis
    fills up until 0.3 s later: the done mark that follows at once meets a full Redis, the
    retry a second later finds room. A fourth run handles it."""
    topic = new_topic(1)
    message = envelope(b"order")
    produce(kafka_bootstrap, topic, [message])
    admin = private_redis.client(timeout_s=5.0)
    admin.config_set("maxmemory-policy", "noeviction")
    calls: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        calls.append(ctx.message_id)
        ctx.tx.hincrby(ctx.key_for("handled"), ctx.message_id, 1)
        if len(calls) > 3:
            return
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", str(max(1, used // 2)))  # full: every write refused
        threading.Timer(0.3, lambda: admin.config_set("maxmemory", "0")).start()

    consumer = two_retries(kafka_bootstrap, private_redis, topic, new_topic, key_prefix,
                           handler, backoff_s=(1.0, 1.0))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            consumer.poll_once()
            stats = consumer.stats()
            if stats.handled or stats.dead_lettered:
                break
        stats = consumer.stats()
    finally:
        consumer.close()
        admin.config_set("maxmemory", "0")
        admin.close()
    print(f"handler calls {len(calls)}, handled {stats.handled}, dead-lettered "
          f"{stats.dead_lettered}, retries {stats.retries}, store outages {stats.store_outages}")
    assert stats.dead_lettered == 0, "a message was dead-lettered because Redis was full"
    assert stats.handled == 1


def test_an_effect_refused_for_its_type_is_counted_even_when_its_key_quotes_oom(
        kafka_bootstrap: str, private_redis: RedisServer, new_topic: Callable[..., str],
        key_prefix: str) -> None:
    """Found by an adversarial read of the rule above: Redis has room; the handler HSETs a key
    built from the payload (untrusted) that holds a string: WRONGTYPE, an EFFECT_ERROR whose
    reason names the key. The payload is "OOM command not allowed": judged by the reason's
    text, it passed for a full Redis, was never counted, and the handler ran without end. It
    is judged by the error Redis gave: dead-lettered after ``max_retries``."""
    topic = new_topic(1)
    produce(kafka_bootstrap, topic, [envelope(b"OOM command not allowed")])
    admin = private_redis.client(timeout_s=5.0)
    calls: list[int] = []

    def handler(ctx: HandlerContext) -> None:
        calls.append(ctx.attempt)
        if len(calls) > 10:  # the defect: stop the loop, the assertion below says why
            raise RuntimeError("test: the handler ran more than 10 times")
        key = ctx.key_for(f"customer:{ctx.payload.decode()}")
        admin.set(key, "a string")  # written by another part of the application
        ctx.tx.hset(key, mapping={"orders": 1})

    consumer = two_retries(kafka_bootstrap, private_redis, topic, new_topic, key_prefix,
                           handler, backoff_s=(0.01, 0.05))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not consumer.stats().dead_lettered:
            consumer.poll_once()
        stats = consumer.stats()
    finally:
        consumer.close()
        admin.close()
    print(f"handler runs {calls}, dead-lettered {stats.dead_lettered}")
    assert calls == [1, 2, 3], f"a WRONGTYPE effect ran the handler {len(calls)} times"
    assert stats.dead_lettered == 1
