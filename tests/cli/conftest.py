"""Fixtures for the CLI tests: click's CliRunner bound to the real Redis and a test prefix."""

from __future__ import annotations

import datetime
import decimal
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner, Result

from eoguard.cli import cli
from eoguard.cli.dev import dev
from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.config import KeepUntil
from eoguard.envelope import Envelope
from eoguard.store.dedup import ClaimResult, DedupStore, DoneResult, position
from eoguard.store.keys import KeySpace
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox, OutboxRecord


@pytest.fixture
def run_cli(redis_url: str, key_prefix: str) -> Callable[..., Result]:
    """Run ``eoguard --redis-url <real> --prefix <this test's> ARGS``; ``input`` feeds prompts."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None, prefix: str | None = None) -> Result:
        argv = ["--redis-url", redis_url, "--prefix", prefix or key_prefix, *args]
        return runner.invoke(cli, argv, input=input, catch_exceptions=True)

    return run


@pytest.fixture
def run_dev(redis_url: str) -> Callable[..., Result]:
    """Run ``eoguard-dev --redis-url <real> ARGS`` (the local stack, the demo)."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(dev, ["--redis-url", redis_url, *args], input=input,
                             catch_exceptions=True)

    return run


def _as_json(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not JSON: {result.stdout!r}")


@pytest.fixture
def as_json() -> Callable[[Result], Any]:
    """Parse what a ``--json`` command printed (asserting exit code 0 first)."""
    return _as_json


# Known state, written through the store wrappers -------------------------------------------

ORDER = "eoguard.example.Order"


def an_order(n: int = 1) -> dict[str, Any]:
    return {"order_id": f"order-{n}", "customer": "customer-7", "amount": decimal.Decimal("12.50"),
            "currency": "EUR", "items": [{"sku": "sku-1", "qty": 2, "unit_price": 6.25}],
            "created_at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
            "express": True, "attributes": {"channel": "web"}, "note": None}


@dataclass
class Seeded:
    """What the ``seeded`` fixture wrote: ids by role."""

    keys: KeySpace
    published: str
    live_pending: list[str]
    stuck: list[str]
    done: list[str]
    claimed_live: str
    claimed_lapsed: str
    done_records: int  # batch records of the done pass (one per shard its claims are on)


def outbox_record(topic: str, *, ttl_ms: int = 600_000, n: int = 1) -> OutboxRecord:
    env = Envelope.create(PayloadCodec().encode(an_order(n), ORDER), ttl_ms=ttl_ms,
                          producer="seed", payload_schema=ORDER)
    return OutboxRecord(id=env.id, topic=topic, key=b"customer-7", value=EnvelopeCodec().encode(env),
                        created_at_ms=env.created_at_ms, expires_at_ms=env.expires_at_ms)


@pytest.fixture
def seeded(redis_client, key_prefix: str) -> Seeded:
    """Outbox: orders = 1 published + 2 pending (live owner); refunds = 2 pending whose owner
    is gone (stuck). Dedup: scope billing = 2 claims of a done pass (token billing-1) + 1 of an
    open pass with a live lease (billing-2); scope shipping = 1 claim of a pass whose lease
    lapsed (shipping-1). One live producer lease (p-live)."""
    keys = KeySpace(prefix=key_prefix)
    box = Outbox(redis_client, keys)
    Liveness(redis_client, keys).heartbeat("p-live", 60_000)
    orders = [outbox_record("orders", n=i) for i in range(3)]
    refunds = [outbox_record("refunds", n=10 + i) for i in range(2)]
    box.put(orders, owner="p-live", keep_until=KeepUntil.CONSUMED, resend_after_ms=600_000)
    box.put(refunds, owner="p-gone", keep_until=KeepUntil.CONSUMED, resend_after_ms=600_000)
    box.mark_published([orders[0].id], keep_until=KeepUntil.CONSUMED)
    billing = DedupStore(redis_client, scope="billing", keys=keys, lease_ms=60_000)
    claims = [billing.new_claim(r.id, position("billing-app", "orders", 0, i), r.expires_at_ms)
              for i, r in enumerate(orders)]
    new = ClaimResult.NEW
    assert [o.result for o in billing.claim("billing-1", claims[:2])] == [new, new]
    assert [o.result for o in billing.done("billing-1", claims[:2])] == [DoneResult.OK] * 2
    assert [o.result for o in billing.claim("billing-2", claims[2:])] == [new]
    shipping = DedupStore(redis_client, scope="shipping", keys=keys, lease_ms=1)
    lapsed = shipping.new_claim(refunds[0].id, position("shipping-app", "refunds", 1, 5),
                                refunds[0].expires_at_ms)
    assert [o.result for o in shipping.claim("shipping-1", [lapsed])] == [new]
    time.sleep(0.01)
    return Seeded(keys=keys, published=orders[0].id, live_pending=[r.id for r in orders[1:]],
                  stuck=[r.id for r in refunds], done=[r.id for r in orders[:2]],
                  claimed_live=orders[2].id, claimed_lapsed=refunds[0].id,
                  done_records=len(billing.records("billing-1", claims[:2])))
