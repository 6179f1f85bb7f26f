"""Adversarial review of the clock clamp (5667848): a producer whose clock runs ahead of Redis's
stamps ``expires_at`` by Redis's clock (``created - lead + max_ttl``), but the writer still
judges "expired while the outbox was unavailable" by this host's clock. A short outbox outage
then fails a message that Redis would still take, long before the TTL asked for: with a lead
beyond max_ttl, at the first failed write (docs/design.md §5, Clocks: "lives at least its
ttl by Redis's clock"; the clamp was meant not to turn a clock error into a lost message)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.errors import StoreUnavailableError
from eoguard.producer import engine, guarded, writer
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


class _AheadClock:
    """The ``time`` module as a host whose wall clock runs ``ahead_ms`` ahead sees it."""

    def __init__(self, ahead_ms: int) -> None:
        self._ahead_ns = ahead_ms * 1_000_000

    def time_ns(self) -> int:
        return time.time_ns() + self._ahead_ns

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.mark.parametrize(
    ("ahead_ms", "max_ttl_ms", "ttl_s", "outage_s"),
    [(3 * HOUR_MS, 2 * HOUR_MS, 600, 1.0),  # lead beyond max_ttl: failed at the first blip
     (6_000, 10_000, 10, 5.0)],  # lead within: failed after max_ttl - lead, not ttl
    ids=["beyond-max-ttl", "within-max-ttl"])
def test_an_outbox_outage_shorter_than_the_ttl_fails_nothing_on_a_clock_ahead(
        kafka_bootstrap: str, redis_url: str, key_prefix: str, new_topic: Any,
        monkeypatch: pytest.MonkeyPatch, ahead_ms: int, max_ttl_ms: int, ttl_s: float,
        outage_s: float) -> None:
    clock = _AheadClock(ahead_ms)
    monkeypatch.setattr(guarded, "now_ms", lambda: clock.time_ns() // 1_000_000)
    monkeypatch.setattr(engine, "now_ms", lambda: clock.time_ns() // 1_000_000)
    monkeypatch.setattr(writer, "time", clock)
    outage_ends = [float("inf")]
    write = Outbox.write

    def flaky_write(self: Outbox, records: Any = (), **kw: Any) -> Any:
        if records and time.monotonic() < outage_ends[0]:
            raise StoreUnavailableError("outage (test)")
        return write(self, records, **kw)

    monkeypatch.setattr(Outbox, "write", flaky_write)
    keys = KeySpace(prefix=key_prefix, shards=2, max_ttl_ms=max_ttl_ms)
    cfg = ProducerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
                         redis=RedisConfig(url=redis_url), default_ttl_s=ttl_s, keyspace=keys,
                         recover_on_start=False)
    failed: list[Exception] = []
    with GuardedProducer(cfg, on_failed=lambda _m, e: failed.append(e)) as producer:
        assert producer._engine.clock_ahead_ms >= ahead_ms - 1000
        outage_ends[0] = time.monotonic() + outage_s
        handle = producer.send(new_topic(), b"v", ttl_s=ttl_s)
        # By Redis's clock the message may live ttl_s at least (min(ttl + lead, max_ttl)).
        assert handle.expires_at_ms - time.time_ns() // 1_000_000 > outage_s * 1000
        assert producer.flush(outage_s + 20) == 0
    assert failed == []
    assert handle.guaranteed
