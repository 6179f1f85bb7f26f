"""The README's python example under "## Using it", run as written on the local stack.

Only names are substituted: the stack's endpoints for the literal addresses, a topic, group and
scope of this test alone, and the final ``consumer.run()`` gets a ``stop=`` that ends it once
the consumer is done. The order is sent, guaranteed, handled once (its Redis effect lands),
and sent again with the same id: a new group of the same scope reads both copies and handles
neither.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from eoguard import ConsumerStats, GuardedConsumer, message_id_for

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^## Using it\n+```python\n(.*?)^```", re.S | re.M)
RUN = "consumer.run()"


def readme_example() -> str:
    match = BLOCK.search(README.read_text())
    assert match, 'README.md has no ```python block right under "## Using it"'
    return match.group(1)


def substituted(code: str, names: dict[str, str]) -> str:
    """``code`` with each literal of ``names`` replaced; every literal must be there (a README
    that changed its addresses or names would otherwise talk to the real "orders" topic)."""
    for old, new in names.items():
        assert old in code, f"the README's example no longer contains {old!r}"
        code = code.replace(old, new)
    return code


def until(condition: Callable[[ConsumerStats], bool], timeout_s: float = 120.0
          ) -> Callable[[GuardedConsumer], bool]:
    """A ``stop=`` for ``consumer.run``: True once the consumer's stats meet ``condition``;
    fails the test when they do not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s

    def finished(consumer: GuardedConsumer) -> bool:
        stats = consumer.stats()
        if condition(stats):
            return True
        assert time.monotonic() < deadline, f"the README's consumer got nowhere: {stats}"
        return False
    return finished


def run_example(code: str, finished: Callable[[GuardedConsumer], bool]
                ) -> tuple[dict[str, Any], str]:
    """Execute the example in a fresh namespace; returns the namespace and what it printed."""
    namespace: dict[str, Any] = {"__name__": "readme_example", "finished": finished}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)
    return namespace, out.getvalue()


def test_the_readme_example_handles_its_order_once_even_when_sent_again(
        kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis[bytes],
        new_topic: Callable[..., str]) -> None:
    code = readme_example()
    assert code.rstrip().endswith(RUN)
    topic, scope = new_topic(1, prefix="readme-orders"), f"readme-{uuid.uuid4().hex[:10]}"
    names = {
        '"redis://127.0.0.1:16379/0"': f'"{redis_url}"',
        '"127.0.0.1:19092"': f'"{kafka_bootstrap}"',
        'producer.send("orders"': f'producer.send("{topic}"',
        'topics=("orders",)': f'topics=("{topic}",)',
        'scope="billing"': f'scope="{scope}"',
        RUN: "consumer.run(stop=lambda: finished(consumer))",
    }

    # Run 1: the order is guaranteed, then handled by the scope, its effect with the done mark.
    first, printed = run_example(
        substituted(code, {**names, '"group.id": "billing"': f'"group.id": "{scope}-1"'}),
        until(lambda stats: stats.handled >= 1))
    order = first["order"]
    message_id = message_id_for("orders", order["order_id"])
    assert f"safe: {message_id}" in printed.splitlines()  # on_guaranteed fired for the order
    handled = first["consumer"].stats()
    assert (handled.handled, handled.duplicates, handled.dead_lettered) == (1, 0, 0)
    keys = first["consumer"].config.keyspace
    totals = keys.effect(scope, message_id, "totals")
    try:
        assert redis_client.hget(totals, order["customer"]) == b"1"  # ctx.payload["customer"]

        # Run 2, in the same scope: the order is sent again (same message_id) and a new group
        # reads the topic from the start, both copies: each is a duplicate, neither handled.
        second, printed = run_example(
            substituted(code, {**names, '"group.id": "billing"': f'"group.id": "{scope}-2"'}),
            until(lambda stats: stats.duplicates + stats.redelivered >= 2))
        assert f"safe: {message_id}" in printed.splitlines()
        again = second["consumer"].stats()
        assert again.handled == 0
        assert redis_client.hget(totals, order["customer"]) == b"1"
        assert redis_client.hlen(totals) == 1
    finally:
        redis_client.delete(totals)
