"""Async callbacks against real Kafka and Redis: an ``async def`` handler or producer callback
is refused where it is taken, naming the fix; a plain one that returns a coroutine has it
closed unrun and loses nothing (a handler's message is not marked done, a producer's
message stays guaranteed)."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

import pytest
import redis

from eoguard.config import ConsumerConfig, ProducerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import now_ms
from eoguard.errors import ConfigError, InvalidMessageError
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import DedupStore
from eoguard.store.dedup_types import IdState
from eoguard.store.keys import KeySpace
from tests.conftest import free_port
from tests.consumer_kit import drain, headers_of, read_all

pytestmark = pytest.mark.integration

FIX = "make it a plain def"


async def async_handler(ctx: HandlerContext) -> None:
    return None


async def async_batch_handler(contexts: Sequence[HandlerContext]) -> None:
    return None


class AsyncCall:
    async def __call__(self, ctx: HandlerContext) -> None:
        return None


ASYNC_HANDLERS = {
    "async def": async_handler,
    "async __call__": AsyncCall(),
    "partial of an async def": functools.partial(async_handler),
}


@pytest.mark.parametrize("handler", ASYNC_HANDLERS.values(), ids=ASYNC_HANDLERS.keys())
def test_an_async_handler_is_refused_at_construction(make, new_topic, handler) -> None:
    with pytest.raises(ConfigError) as refused:
        make([new_topic(1)], handler)
    text = str(refused.value)
    assert text.startswith("handler is an async def callable")
    assert FIX in text
    assert "never awaits" in text


def test_an_async_batch_handler_is_refused_at_construction(make, new_topic) -> None:
    with pytest.raises(ConfigError, match=f"^batch_handler is an async def callable.*{FIX}"):
        make([new_topic(1)], batch_handler=async_batch_handler)


def test_an_async_handler_is_refused_before_any_connection(kafka_bootstrap) -> None:
    # Nothing listens on the Redis port: the refusal comes first, not a StoreUnavailableError.
    config = ConsumerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "group.id": "g"},
                            redis=RedisConfig(url=f"redis://127.0.0.1:{free_port()}/0"),
                            scope="s", topics=("t",))
    with pytest.raises(ConfigError, match="handler is an async def callable"):
        GuardedConsumer(config, handler=async_handler)  # type: ignore[arg-type]


def _dedup(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    return DedupStore(redis_client, scope="app", keys=KeySpace(prefix=key_prefix))


def test_a_handler_returning_a_coroutine_is_not_marked_done_and_is_dead_lettered(
        make, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    good, bad = envelope(b"good"), envelope(b"bad")
    produce(kafka_bootstrap, topic, [good, bad, envelope(b"after")], partition=0)
    returned: list[Coroutine[Any, Any, None]] = []
    handled: list[str] = []

    def handler(ctx: HandlerContext) -> Any:  # a plain def that hands back a coroutine
        if ctx.message_id == bad.id:
            returned.append(async_handler(ctx))
            return returned[-1]
        handled.append(ctx.message_id)
        return None

    consumer = make([topic], handler, dead_letter_topic=dlq, max_retries=1)
    # poll_once never raises: drain polls until the bad message is dead-lettered.
    drain([consumer], lambda: consumer.stats().dead_lettered >= 1 and len(handled) >= 2)
    stats = consumer.stats()
    assert stats.handled == 2
    assert stats.retries == 1
    assert len(returned) == 2  # two attempts, both failed
    assert all(inspect.getcoroutinestate(c) == inspect.CORO_CLOSED for c in returned)
    store = _dedup(redis_client, key_prefix)
    assert store.check(bad.id) is None  # let go, never marked done
    done = store.check(good.id)
    assert done is not None
    assert done.id_state(now_ms()) is IdState.DONE
    [letter] = read_all(kafka_bootstrap, dlq, 1)
    headers = headers_of(letter)
    assert headers["eoguard.message.id"] == bad.id
    assert headers["eoguard.error.type"] == "InvalidInputError"
    assert headers["eoguard.error.attempts"] == "2"
    assert "handler returned an awaitable (coroutine)" in headers["eoguard.error.reason"]
    assert FIX in headers["eoguard.error.reason"]


def test_a_batch_handler_returning_a_coroutine_fails_its_batch_without_crashing(
        make, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    envs = [envelope(b"m%d" % i) for i in range(3)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    returned: list[Coroutine[Any, Any, None]] = []

    def batch_handler(contexts: Sequence[HandlerContext]) -> Any:
        returned.append(async_batch_handler(contexts))
        return returned[-1]

    consumer = make([topic], batch_handler=batch_handler, dead_letter_topic=dlq, max_retries=0)
    drain([consumer], lambda: consumer.stats().dead_lettered >= len(envs))  # no AttributeError
    assert consumer.stats().handled == 0
    assert returned
    assert all(inspect.getcoroutinestate(c) == inspect.CORO_CLOSED for c in returned)
    store = _dedup(redis_client, key_prefix)
    assert [store.check(e.id) for e in envs] == [None] * len(envs)
    letters = read_all(kafka_bootstrap, dlq, len(envs))
    assert sorted(headers_of(m)["eoguard.message.id"] for m in letters) == sorted(e.id for e in envs)
    assert {headers_of(m)["eoguard.error.type"] for m in letters} == {"InvalidInputError"}


# --- GuardedProducer ---------------------------------------------------------------------------


def _producer_config(kafka_bootstrap: str, redis_url: str, key_prefix: str) -> ProducerConfig:
    return ProducerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
                          redis=RedisConfig(url=redis_url), default_ttl_s=600,
                          keyspace=KeySpace(prefix=key_prefix, shards=8))


async def async_guaranteed(handle: Any) -> None:
    return None


async def async_failed(handle: Any, error: Exception) -> None:
    return None


def test_async_producer_callbacks_are_refused_at_construction(kafka_bootstrap, redis_url,
                                                              key_prefix) -> None:
    config = _producer_config(kafka_bootstrap, redis_url, key_prefix)
    with pytest.raises(ConfigError, match=f"^on_guaranteed is an async def callable.*{FIX}"):
        GuardedProducer(config, on_guaranteed=async_guaranteed)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^on_failed is an async def callable.*{FIX}"):
        GuardedProducer(config, on_failed=functools.partial(async_failed))  # type: ignore[arg-type]


def test_async_callbacks_of_a_send_are_refused_and_nothing_is_sent(
        kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    topic = new_topic(1)
    with GuardedProducer(_producer_config(kafka_bootstrap, redis_url, key_prefix)) as producer:
        with pytest.raises(InvalidMessageError, match=f"^on_guaranteed is an async.*{FIX}"):
            producer.send(topic, b"x", on_guaranteed=async_guaranteed)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError, match=f"^on_failed is an async.*{FIX}"):
            producer.send(topic, b"x", on_failed=async_failed)  # type: ignore[arg-type]
        assert producer.stats().sent == 0


def test_a_producer_callback_returning_a_coroutine_leaves_the_guarantee_alone(
        kafka_bootstrap, redis_url, key_prefix, new_topic, caplog) -> None:
    returned: list[Coroutine[Any, Any, None]] = []

    def on_guaranteed(handle: Any) -> Any:  # a plain def that hands back a coroutine
        returned.append(async_guaranteed(handle))
        return returned[-1]

    caplog.set_level(logging.ERROR, logger="eoguard.producer.callbacks")
    with GuardedProducer(_producer_config(kafka_bootstrap, redis_url, key_prefix),
                         on_guaranteed=on_guaranteed) as producer:
        handles = [producer.send(new_topic(1), b"x") for _ in range(5)]
        assert producer.flush(30) == 0
        assert all(h.wait(10) for h in handles)
        assert producer.stats().guaranteed == 5
    # close() ran every queued callback: each returned a coroutine, closed unrun and logged.
    assert len(returned) == 5
    assert all(inspect.getcoroutinestate(c) == inspect.CORO_CLOSED for c in returned)
    logged = [r.getMessage() for r in caplog.records
              if "on_guaranteed returned an awaitable" in r.getMessage()]
    assert len(logged) == 5
    assert all(FIX in line for line in logged)
    assert sorted(h.id for h in handles) == sorted(line.split()[4].rstrip(":") for line in logged)
