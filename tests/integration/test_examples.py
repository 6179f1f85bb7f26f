"""The examples of examples/ run as a user runs them (their ``main`` with command-line
arguments), against the real stack, and do what their docstrings say. The async app's
examples run in tests/integration/test_asgi_orders_consumer.py, the Spark job's in
tests/spark/test_example_job.py."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import redis

from eoguard.store.keys import KeySpace

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """An example module by name, imported as its script runs (examples/ first on sys.path)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module


@pytest.fixture
def stack_args(kafka_bootstrap: str, redis_url: str, key_prefix: str) -> list[str]:
    return ["--bootstrap", kafka_bootstrap, "--redis", redis_url, "--prefix", key_prefix]


def effects(client: redis.Redis, prefix: str, scope: str, name: str) -> list[bytes]:
    """The keys of one effect of ``scope`` (``ctx.key_for(name)``: one per shard)."""
    return list(client.scan_iter(match=KeySpace(prefix=prefix).effect_pattern(scope, name)))


def revenue_and_orders(client: redis.Redis, prefix: str, scope: str) -> tuple[int, set[str]]:
    revenue = sum(int(client.get(k) or 0) for k in effects(client, prefix, scope, "revenue_cents"))
    orders: set[str] = set()
    for key in effects(client, prefix, scope, "orders"):
        orders |= {m.decode() for m in client.smembers(key)}
    return revenue, orders


def test_orders_sent_twice_are_handled_once(example, stack_args, new_topic, redis_client,
                                            key_prefix, capsys) -> None:
    topic = new_topic(2)
    producer, consumer = example("orders_producer"), example("orders_consumer")
    send = [*stack_args, "--topic", topic, "--count", "20"]
    handle = [*stack_args, "--topic", topic, "--group", f"billing-{key_prefix}", "--records", "20"]
    assert producer.main(send) == 0
    assert consumer.main(handle) == 0
    # sent again once the consumer acknowledged the outbox records: published again, same ids
    assert producer.main(send) == 0
    assert consumer.main(handle) == 0

    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("handled")]
    assert out == ["handled 20, duplicates 0, dead-lettered 0",
                   "handled 0, duplicates 20, dead-lettered 0"]
    revenue, orders = revenue_and_orders(redis_client, key_prefix, "billing")
    assert orders == {f"o-{i}" for i in range(20)}
    assert revenue == sum(i * 100 + 50 for i in range(20))


def test_consumer_first_handles_a_plain_avro_topic_once(example, stack_args, new_topic,
                                                        schema_registry_url, redis_client,
                                                        key_prefix, capsys) -> None:
    topic = new_topic(2)
    assert example("consumer_first").main([*stack_args, "--registry", schema_registry_url,
                                           "--topic", topic, "--count", "20"]) == 0

    assert capsys.readouterr().out.splitlines()[-1] == "handled 20, duplicates 10, dead-lettered 0"
    revenue, orders = revenue_and_orders(redis_client, key_prefix, "billing")
    assert orders == {f"p-{i}" for i in range(20)}
    assert revenue == sum(i * 100 + 50 for i in range(20))
