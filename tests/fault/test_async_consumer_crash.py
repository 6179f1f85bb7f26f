"""Two AsyncGuardedConsumer processes of one group, SIGKILLed in turn mid-batch.

4,000 keyed messages plus expired ones and resends, handled by an ``async def`` handler with
Redis-transactional effects, eight at a time in key order (tests/fault/workers/
async_consumer_worker.py). Member "a" starts alone; "b" joins after a's first batches (a
rebalance between the two); then, at seeded kill points, one member or the other is
SIGKILLed just after it reported a batch, and started again (a static member: it takes its
partitions back at once). At the end both are stopped with SIGTERM (run() cancelled: the
batch in flight finished, the rest given back). Checked: every unexpired message's effect
exactly once, none for an expired one, and the group's offsets at the end of every partition.
"""

from __future__ import annotations

import random
import time

import pytest
import redis

from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace
from tests.consumer_kit import committed_total
from tests.fault.consumer_fault_kit import Worker, effect_counts, unique_group

pytestmark = pytest.mark.fault

LIVE, EXPIRED, RESENT, PARTITIONS, KEYS = 4_000, 100, 100, 4, 60
SEED = 38
KILLS = ("a", "b", "a", "b")  # the member SIGKILLed at each kill point, in turn


def test_async_consumers_killed_mid_batch_apply_each_effect_exactly_once(
        new_topic, kafka_bootstrap, redis_url, key_prefix, tmp_path) -> None:
    rng = random.Random(SEED)
    topic = new_topic(PARTITIONS)
    live = [envelope(b"v%d" % i, ttl_ms=3_600_000) for i in range(LIVE)]
    expired = [envelope(b"old", ttl_ms=-1) for _ in range(EXPIRED)]
    records = [(e, b"k%d" % rng.randrange(KEYS)) for e in live]
    for env in expired:
        records.insert(rng.randrange(len(records)), (env, b"k0"))
    resent = [(e.with_attempt(2), key) for e, key in rng.sample(records[:LIVE], RESENT)]
    produced = produce(kafka_bootstrap, topic, [e for e, _ in [*records, *resent]],
                       keys=[k for _, k in [*records, *resent]])
    scope, group = "acrash", unique_group("acrash")
    keys = KeySpace(prefix=key_prefix)
    client = redis.Redis.from_url(redis_url)
    log = tmp_path / "workers.log"

    def start(member: str) -> Worker:
        worker = Worker("async_consumer_worker.py", kafka_bootstrap, redis_url, topic,
                        key_prefix, scope, group, member, log=log)
        worker.wait_for("ready")
        return worker

    members = {"a": start("a")}
    members["a"].wait_for("batch")
    members["b"] = start("b")  # joins: the group rebalances while a handles
    for victim in KILLS:
        for _ in range(rng.randint(1, 3)):  # none for 5 s: its partitions are done
            if members[victim].wait_for("batch", timeout_s=5, missing_ok=True) is None:
                break
        time.sleep(rng.uniform(0.0, 0.01))  # in a handler, the done round trip or after
        members[victim].kill()
        members[victim] = start(victim)
    progress = len(effect_counts(client, keys, scope)[0])

    deadline = time.monotonic() + 60
    while len(effect_counts(client, keys, scope)[0]) < LIVE:
        assert time.monotonic() < deadline, "the consumers did not finish (see workers.log)"
        time.sleep(0.2)
    committed, end = committed_total(kafka_bootstrap, group, topic, PARTITIONS)
    while committed < end and time.monotonic() < deadline:
        time.sleep(0.2)
        committed, end = committed_total(kafka_bootstrap, group, topic, PARTITIONS)
    stopped = []
    for worker in members.values():
        worker.proc.terminate()
        stopped.append(worker.wait_for("stopped", timeout_s=30))
        worker.proc.wait(30)
        worker.stop()

    seen, counts = effect_counts(client, keys, scope)
    doubled = {mid: n for mid, n in counts.items() if n != 1}
    live_ids = {e.id for e in live}
    print(f"\nrecords produced {produced}; SIGKILLs {len(KILLS)}; handled before the last "
          f"restart {progress}; effects {len(seen)}; not once: {len(doubled)}; committed "
          f"{committed}/{end}")
    assert progress < LIVE, "every kill came after the end: nothing was interrupted"
    assert seen == live_ids  # no loss, nothing expired handled
    assert set(counts) == live_ids
    assert doubled == {}  # no effect twice
    assert committed == end  # no partition stopped
    assert all(line is not None for line in stopped)  # SIGTERM cancelled run(): it closed
    client.close()
