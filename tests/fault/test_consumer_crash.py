"""A consumer process SIGKILLed again and again in the middle of handler batches.

Over 10k guaranteed (acks=all) messages plus expired ones and resends, with a Redis-transactional
handler (a per-id counter INCR and a SADD, committed with the done mark): at the end every
unexpired message's effect exists exactly once, no expired one has an effect, the group's
offsets reached the end of every partition, and dedup keys expire at expires_at + grace.
"""

from __future__ import annotations

import random
import time

import pytest
import redis

from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace
from tests.consumer_kit import committed_total
from tests.fault.consumer_fault_kit import (
    Worker,
    check_dedup_ttls,
    effect_counts,
    unique_group,
)

pytestmark = pytest.mark.fault

LIVE, EXPIRED, RESENT, PARTITIONS, KILLS = 10_000, 300, 300, 4, 8
GRACE_MS = 300_000  # ConsumerConfig's default grace_s


def test_consumer_killed_mid_batch_handles_every_message_exactly_once(
        new_topic, kafka_bootstrap, redis_url, key_prefix, tmp_path) -> None:
    rng = random.Random()
    topic = new_topic(PARTITIONS)
    live = [envelope(b"v%d" % i, ttl_ms=3_600_000) for i in range(LIVE)]
    expired = [envelope(b"old", ttl_ms=-1) for _ in range(EXPIRED)]
    resent = [e.with_attempt(2) for e in rng.sample(live, RESENT)]
    records = list(live)
    for env in expired:
        records.insert(rng.randrange(len(records)), env)
    produced = produce(kafka_bootstrap, topic, [*records, *resent])
    scope, group = "crash", unique_group("crash")
    args = (kafka_bootstrap, redis_url, topic, key_prefix, scope, group)
    keys = KeySpace(prefix=key_prefix)
    client = redis.Redis.from_url(redis_url)

    kills = 0
    for _ in range(KILLS):
        worker = Worker("consumer_worker.py", *args, log=tmp_path / "worker.log")
        worker.wait_for("ready")
        for _ in range(rng.randint(1, 4)):
            if worker.wait_for("batch") is None:
                break
        time.sleep(rng.uniform(0.0, 0.06))  # inside the handler, the done round trip or after
        worker.kill()
        kills += 1
    progress = len(effect_counts(client, keys, scope)[0])

    worker = Worker("consumer_worker.py", *args, log=tmp_path / "worker.log")
    deadline = time.monotonic() + 240
    while len(effect_counts(client, keys, scope)[0]) < LIVE:
        assert time.monotonic() < deadline, "the restarted consumer did not finish"
        time.sleep(0.5)
    time.sleep(2.0)  # a late duplicate effect would show up now
    committed, end = committed_total(kafka_bootstrap, group, topic, PARTITIONS)
    deadline = time.monotonic() + 30
    while committed < end and time.monotonic() < deadline:
        time.sleep(0.5)
        committed, end = committed_total(kafka_bootstrap, group, topic, PARTITIONS)
    worker.stop()

    seen, counts = effect_counts(client, keys, scope)
    doubled = {mid: n for mid, n in counts.items() if n != 1}
    live_ids = {e.id for e in live}
    print(f"\nrecords produced {produced} (live {LIVE}, expired {EXPIRED}, resent {RESENT}); "
          f"SIGKILLs {kills}; handled before the last restart {progress}; effects {len(seen)}; "
          f"counters {len(counts)} (not 1: {len(doubled)}); committed {committed}/{end}")
    assert kills == KILLS
    assert progress < LIVE, "every kill came after the end: nothing was interrupted"
    assert seen == live_ids  # 1. no loss (and 3. no expired one)
    assert set(counts) == live_ids
    assert doubled == {}  # 2. no duplicate effect
    assert not {e.id for e in expired} & (seen | set(counts))  # 3. expired never handled
    assert committed == end  # no partition stopped
    check_dedup_ttls(client, keys, scope, rng.sample(live, 200), GRACE_MS)  # 5.
    client.close()
