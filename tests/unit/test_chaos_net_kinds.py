"""The chaos suite's network and clock faults in its schedules: drawn from a stream of their own, so
the other faults a seed draws stay what they were (tests/fault/chaos/schedule.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.fault.chaos.schedule import CLOCK_FAULTS, FULL_WINDOW_S, NET_FAULTS, SPLIT_BRAIN, schedule

EXTRA = (*NET_FAULTS, *CLOCK_FAULTS, *SPLIT_BRAIN["cluster"])

CI_WINDOW_S = 40.0


@pytest.mark.parametrize("topology", ["single", "cluster"])
@pytest.mark.parametrize(("window_s", "drawn"), [(CI_WINDOW_S, 1), (FULL_WINDOW_S, 3)])
def test_a_run_draws_one_network_fault_per_40_s_none_twice(topology: str, window_s: float,
                                                          drawn: int) -> None:
    for seed in range(1, 50):
        net = [f for f in schedule(seed, topology, window_s) if f.kind in EXTRA]
        assert len(net) == len({f.kind for f in net}) == drawn, seed
        assert all(0 < f.at_s < window_s and f.hold_s > 0 for f in net), seed


@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_the_network_faults_leave_the_others_as_they_were(topology: str) -> None:
    for seed in range(1, 20):
        drawn = [f for f in schedule(seed, topology, FULL_WINDOW_S) if f.kind not in EXTRA]
        named = [f for f in schedule(seed, topology, FULL_WINDOW_S, ("slow-link-redis",))
                 if f.kind not in EXTRA]
        assert drawn == named, seed


def test_named_network_faults_replace_the_drawn_ones() -> None:
    plan = schedule(3, "single", CI_WINDOW_S, ("consumer-cut-redis", "producer-cut-kafka"))
    assert sorted(f.kind for f in plan if f.kind in EXTRA) == ["consumer-cut-redis",
                                                                    "producer-cut-kafka"]


@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_ten_full_mode_seeds_draw_each_network_or_clock_fault_three_times(topology: str) -> None:
    drawn = Counter(f.kind for seed in range(1, 11)
                    for f in schedule(seed, topology, FULL_WINDOW_S) if f.kind in EXTRA)
    assert set(drawn) == {*NET_FAULTS, *CLOCK_FAULTS, *SPLIT_BRAIN[topology]}
    assert min(drawn.values()) >= 3, drawn
