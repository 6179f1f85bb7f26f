"""Fixtures of the integration tests: GuardedConsumers built on the local stack, closed after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from eoguard.consumer.aio import AsyncGuardedConsumer
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack.redis_server import RedisServer
from eoguard.store.dedup import DedupStore
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import lua_script
from tests.consumer_kit import consumer_config
from tests.dedup_kit import GRACE_MS, LEASE_MS


@pytest.fixture
def made() -> Iterator[list[GuardedConsumer]]:
    consumers: list[GuardedConsumer] = []
    yield consumers
    for consumer in consumers:
        consumer.close()


@pytest.fixture
def make(made, kafka_bootstrap: str, redis_url: str, key_prefix: str, new_topic
         ) -> Callable[..., GuardedConsumer]:
    def build(topics: list[str], handler: Callable[[HandlerContext], None] | None = None,
              **kw: Any) -> GuardedConsumer:
        batch_handler = kw.pop("batch_handler", None)
        client = kw.pop("redis", None)
        registry = kw.pop("registry", None)
        kw.setdefault("dead_letter_topic", new_topic(1, prefix="dlq"))
        config = consumer_config(kafka_bootstrap, redis_url, topics, prefix=key_prefix, **kw)
        consumer = GuardedConsumer(config, handler=handler, batch_handler=batch_handler,
                                   redis=client, registry=registry)
        made.append(consumer)
        return consumer
    return build


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    return DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix),
                      lease_ms=LEASE_MS, grace_ms=GRACE_MS)


@pytest.fixture
def one_shard(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    """A store whose claims all share one shard: one batch record per token."""
    return DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix, shards=1),
                      lease_ms=LEASE_MS, grace_ms=GRACE_MS)


@pytest.fixture
def own_redis(private_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of a Redis of this test alone, the dedup scripts loaded (a NOSCRIPT answer
    would count a second call)."""
    client = redis.Redis.from_url(private_redis.address)
    for name in ("dedup_claim", "dedup_done", "dedup_release", "dedup_renew"):
        client.script_load(lua_script(name).source)
    yield client
    client.close()


@pytest.fixture
def async_consumer(kafka_bootstrap: str, redis_url: str, key_prefix: str, new_topic
                   ) -> Callable[..., AsyncGuardedConsumer]:
    """Builds AsyncGuardedConsumers of a topic (scope DEFAULT_SCOPE, a dead-letter topic of
    the test's): ``make(topic, handler, group=..., concurrency=..., **config)``."""
    # Created here, not in make(): make() runs on the loop, where creating a topic (a
    # blocking admin call) would hold it over the debug loop's 100 ms.
    dead_letters = new_topic(1, prefix="dlq")

    def make(topic: str, handler: Any = None, *, group: str | None = None,
             **kw: Any) -> AsyncGuardedConsumer:
        lanes = {k: kw.pop(k) for k in ("concurrency", "keep_key_order", "handler_timeout_s")
                 if k in kw}
        kw.setdefault("dead_letter_topic", dead_letters)
        config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                                 group=group, **kw)
        return AsyncGuardedConsumer(config, handler=handler, **lanes)
    return make
