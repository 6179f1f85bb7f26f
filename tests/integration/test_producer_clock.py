"""A producer whose clock runs ahead of Redis's (docs/design.md §5, Clocks): ``send`` stamps no
expiry beyond Redis's now + max_ttl, so its outbox records keep their bound and a consumer in
step with Redis accepts every message it called guaranteed."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from eoguard.codec import EnvelopeCodec
from eoguard.codec.rules import InputLimits, check_envelope
from eoguard.config import ProducerConfig, RedisConfig
from eoguard.producer import engine, guarded
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
MAX_TTL_MS = 2 * HOUR_MS


def real_now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.cluster
@pytest.mark.parametrize("ahead_ms", [HOUR_MS, 3 * HOUR_MS], ids=["1h-ahead", "beyond-max-ttl"])
def test_a_clock_ahead_of_redis_never_stamps_an_expiry_beyond_max_ttl(
        kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, key_prefix: str,
        new_topic, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        ahead_ms: int) -> None:
    def ahead() -> int:  # this host's clock, as the producer reads it
        return real_now_ms() + ahead_ms

    monkeypatch.setattr(guarded, "now_ms", ahead)
    monkeypatch.setattr(engine, "now_ms", ahead)
    keys = KeySpace(prefix=key_prefix, shards=4, max_ttl_ms=MAX_TTL_MS)
    cfg = ProducerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
                         redis=RedisConfig(url=redis_url), default_ttl_s=600, keyspace=keys)
    topic = new_topic()
    before = real_now_ms()  # Redis runs on this host: its clock is the real one
    with caplog.at_level(logging.WARNING, logger="eoguard.producer.engine"), \
            GuardedProducer(cfg) as producer:
        assert ahead_ms - 1000 <= producer._engine.clock_ahead_ms <= ahead_ms
        longest = [producer.send(topic, b"v", ttl_s=MAX_TTL_MS / 1000) for _ in range(20)]
        short = producer.send(topic, b"v", ttl_s=600)
        assert producer.flush(30) == 0
    after = real_now_ms()
    assert "ahead of Redis's" in caplog.text
    assert all(h.guaranteed for h in [*longest, short])
    # The longest TTL: at least max_ttl from now by Redis's clock, never more.
    for h in longest:
        assert before + MAX_TTL_MS <= h.expires_at_ms <= after + MAX_TTL_MS
    outbox = Outbox(redis_client, keys)
    codec = EnvelopeCodec()
    exact = InputLimits(clock_skew_ms=0)  # a consumer in step with Redis, no tolerance
    for h in [*longest, short]:
        stored = outbox.get(h.id)
        assert stored is not None
        assert stored.expires_at_ms == h.expires_at_ms
        assert 0 < redis_client.pttl(keys.outbox_record(h.id)) <= MAX_TTL_MS
        env = codec.decode(stored.value)
        assert (env.expires_at_ms, env.created_at_ms) == (h.expires_at_ms, stored.created_at_ms)
        check_envelope(env, now_ms=real_now_ms(), max_ttl_ms=MAX_TTL_MS, limits=exact)
    short_env = codec.decode(outbox.get(short.id).value)  # type: ignore[union-attr]
    if ahead_ms + 600_000 <= MAX_TTL_MS:  # within the bound: stamped by this host's clock
        assert short_env.expires_at_ms - short_env.created_at_ms == 600_000
        assert short_env.created_at_ms >= before + ahead_ms
    else:  # a clock ahead by more than max_ttl: created_at is never after expires_at
        assert short_env.created_at_ms == short_env.expires_at_ms <= after + MAX_TTL_MS
