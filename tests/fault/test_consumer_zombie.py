"""A zombie consumer: paused with SIGSTOP past its lease while its partition moves, then resumed.

Dedup v2 fences per key: a batch's done marks apply a message's Redis-transactional effects
only where its claim key still names the batch's token. Two orderings, both real processes:

- ``after``: the zombie is paused mid-batch; a new member of the group takes the partition
  (static membership: same instance id), re-reads the uncommitted records (MINE: re-owned under
  its own tokens), handles and commits them; then the zombie resumes and its done marks land:
  NOT_OWNED, nothing applied.
- ``before``: the zombie is paused mid-batch past its lease and its session; it resumes before
  any other member reads, its done marks land (the claims still name its token) and its commit
  is refused; the new member then re-reads the records and finds them DONE_HERE.

Either way every message's effect exists exactly once (docs/design.md §10 invariants 1 and 2), and
the group's offsets reach the end of the partition.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import KeySpace
from tests.consumer_kit import committed_total
from tests.fault.consumer_fault_kit import Worker, effect_counts, unique_group

pytestmark = pytest.mark.fault

MESSAGES = 3_000
PAUSE_S = 14.0  # past the worker's lease (10 s) and its session timeout (6 s)


@pytest.mark.parametrize("zombie_done", ["after", "before"])
def test_a_zombies_done_marks_never_apply_an_effect_twice(
        zombie_done: str, new_topic, kafka_bootstrap, redis_url, key_prefix, tmp_path) -> None:
    topic = new_topic(1)
    envs = [envelope(b"z%d" % i, ttl_ms=3_600_000) for i in range(MESSAGES)]
    produce(kafka_bootstrap, topic, envs)
    scope, group = "zombie", unique_group("zombie")
    args = (kafka_bootstrap, redis_url, topic, key_prefix, scope, group)
    keys = KeySpace(prefix=key_prefix)
    client = redis.Redis.from_url(redis_url)
    ids = {e.id for e in envs}

    zombie = Worker("consumer_worker.py", *args, log=tmp_path / "zombie.log")
    zombie.wait_for("ready")
    for _ in range(3):
        assert zombie.wait_for("batch") is not None
    os.kill(zombie.proc.pid, signal.SIGSTOP)  # mid-batch: inside its handler or its done
    paused_at = len(effect_counts(client, keys, scope)[0])
    successor: Worker | None = None
    try:
        if zombie_done == "after":
            successor = Worker("consumer_worker.py", *args, log=tmp_path / "successor.log")
            _wait_until(lambda: len(effect_counts(client, keys, scope)[0]) >= MESSAGES, 120)
            time.sleep(1.0)
            os.kill(zombie.proc.pid, signal.SIGCONT)  # its done marks land now: fenced
        else:
            time.sleep(PAUSE_S)
            os.kill(zombie.proc.pid, signal.SIGCONT)  # its done marks land: still its claims
            time.sleep(2.0)
            successor = Worker("consumer_worker.py", *args, log=tmp_path / "successor.log")
            _wait_until(lambda: len(effect_counts(client, keys, scope)[0]) >= MESSAGES, 120)
        time.sleep(3.0)  # a late effect of the zombie would show up now
        _wait_until(lambda: _committed(kafka_bootstrap, group, topic), 60)
    finally:
        os.kill(zombie.proc.pid, signal.SIGCONT)
        zombie.kill()
        if successor is not None:
            successor.stop()

    seen, counts = effect_counts(client, keys, scope)
    doubled = {mid: n for mid, n in counts.items() if n != 1}
    committed, end = committed_total(kafka_bootstrap, group, topic, 1)
    print(f"\n[{zombie_done}] messages {MESSAGES}; handled when the zombie paused {paused_at}; "
          f"effects {len(seen)}; counters {len(counts)} (not 1: {len(doubled)}); "
          f"committed {committed}/{end}")
    assert 0 < paused_at < MESSAGES  # the pause fell in the middle of the stream
    assert seen == ids  # 1. no loss
    assert set(counts) == ids
    assert doubled == {}  # 2. no effect applied twice
    assert committed == end


def _committed(bootstrap: str, group: str, topic: str) -> bool:
    committed, end = committed_total(bootstrap, group, topic, 1)
    return committed == end


def _wait_until(done, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)
