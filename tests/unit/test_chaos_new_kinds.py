"""The chaos suite's resharding and speculation faults in its schedules, and the hash slots a
resharding moves (tests/fault/chaos/schedule.py, reshard.py)."""

from __future__ import annotations

import uuid

import pytest
from redis.crc import key_slot

from eoguard.store.keys import KeySpace
from tests.fault.chaos.reshard import run_slots
from tests.fault.chaos.schedule import EARLY, FULL_WINDOW_S, schedule
from tests.fault.chaos.workload import SCOPES

CI_SEEDS = (1, 2)  # test_seeded.py without EOGUARD_CHAOS_SEEDS: seeds 1 and 2, a 40 s window
CI_WINDOW_S = 40.0


def test_the_ci_seeds_reshard_the_cluster_in_the_first_half_of_the_window() -> None:
    reshards = [f for seed in CI_SEEDS for f in schedule(seed, "cluster", CI_WINDOW_S)
                if f.kind == "redis-reshard"]
    assert reshards, "CI's cluster seeds draw no resharding"
    assert all(f.at_s <= EARLY["redis-reshard"] * CI_WINDOW_S for f in reshards)


@pytest.mark.parametrize("window_s", [CI_WINDOW_S, FULL_WINDOW_S])
def test_each_new_kind_strikes_its_topology_alone_and_at_most_once(window_s: float) -> None:
    for seed in range(1, 50):
        single = [f.kind for f in schedule(seed, "single", window_s)]
        cluster = [f.kind for f in schedule(seed, "cluster", window_s)]
        assert "redis-reshard" not in single
        assert "spark-speculation" not in cluster
        assert single.count("spark-speculation") <= 1
        assert cluster.count("redis-reshard") <= 1
        early = [f for f in schedule(seed, "cluster", window_s) if f.kind in EARLY]
        assert all(f.at_s <= EARLY[f.kind] * window_s for f in early), seed


def test_the_spark_job_speculates_in_full_mode_only() -> None:
    assert not any(f.kind == "spark-speculation" for seed in range(1, 50)
                   for f in schedule(seed, "single", CI_WINDOW_S))
    drawn = [seed for seed in range(1, 16)
             if any(f.kind == "spark-speculation" for f in schedule(seed, "single", FULL_WINDOW_S))]
    assert len(drawn) >= 3


def test_the_slots_a_resharding_moves_hold_every_key_of_the_run() -> None:
    keys = KeySpace(prefix=f"chaos{uuid.uuid4().hex[:8]}")
    slots = run_slots(keys, SCOPES)
    for _ in range(500):
        message_id = str(uuid.uuid4())
        shard = keys.shard_of(message_id)
        names = [keys.outbox_record(message_id), keys.outbox_index(shard)]
        for scope in SCOPES:
            names += [keys.dedup(scope, message_id), keys.dedup_batch(scope, shard, "t"),
                      keys.dedup_reowned(scope, shard, "t"), keys.dedup_passed(scope, shard, "t"),
                      keys.effect(scope, message_id, "handled")]
        assert {key_slot(name.encode()) for name in names} <= slots.keys()
    assert {key_slot(k.encode()) for k in (keys.live_producers(), keys.live_consumers(),
                                           keys.layout())} <= slots.keys()
