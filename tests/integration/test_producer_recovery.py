"""GuardedProducer.recover against the real Kafka and Redis: a resend is marked published by
its record's own keep_until, whatever the recovering producer's."""

from __future__ import annotations

import time

import pytest
import redis

from eoguard.config import KeepUntil, ProducerConfig, RedisConfig
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox, RecordState
from tests.redis_kit import abandoned

pytestmark = pytest.mark.integration

@pytest.mark.parametrize(("written", "recoverer"), [
    (KeepUntil.PUBLISHED, KeepUntil.CONSUMED), (KeepUntil.CONSUMED, KeepUntil.PUBLISHED)])
@pytest.mark.cluster
def test_resends_follow_the_records_keep_until(kafka_bootstrap, redis_url,
                                               redis_client: redis.Redis, key_prefix, new_topic,
                                               written: KeepUntil, recoverer: KeepUntil) -> None:
    topic = new_topic()
    keys = KeySpace(prefix=key_prefix, shards=8)
    outbox = Outbox(redis_client, keys)
    recs = abandoned(outbox, topic, written, 20)
    time.sleep(0.01)  # owned before the recoverer reads the live set
    cfg = ProducerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
                         redis=RedisConfig(url=redis_url), keyspace=keys, keep_until=recoverer,
                         default_ttl_s=600)
    with GuardedProducer(cfg) as producer:  # recovers at start
        assert producer.flush(30) == 0
        assert producer.stats().resent == 20
    assert outbox.pending_ids() == {}  # every resend was marked published
    stored = [outbox.get(r.id) for r in recs]
    if written is KeepUntil.PUBLISHED:
        assert stored == [None] * 20  # deleted on publication, as written
    else:
        assert {s.state for s in stored if s is not None} == {RecordState.PUBLISHED}
        assert all(s is not None and s.attempt == 2 for s in stored)  # kept for the consumer
        assert outbox.expire_times([r.id for r in recs]) == {
            r.id: r.expires_at_ms for r in recs}
