"""Fixtures of the integration tests: GuardedConsumers built on the local stack, closed after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from tests.consumer_kit import consumer_config


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
        kw.setdefault("dead_letter_topic", new_topic(1, prefix="dlq"))
        config = consumer_config(kafka_bootstrap, redis_url, topics, prefix=key_prefix, **kw)
        consumer = GuardedConsumer(config, handler=handler, batch_handler=batch_handler,
                                   redis=client)
        made.append(consumer)
        return consumer
    return build
