"""The chaos suite's schedule generator: a seed replays its schedule, and the seeds cover
every fault of each topology (tests/fault/chaos/schedule.py)."""

from __future__ import annotations

import pytest

from tests.fault.chaos.schedule import (
    CLOCK_FAULTS,
    NET_FAULTS,
    SERVICE_FAULTS,
    SPLIT_BRAIN,
    WORKER_FAULTS,
    schedule,
)


@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_a_seed_replays_its_schedule_and_other_seeds_differ(topology: str) -> None:
    assert schedule(7, topology, 120) == schedule(7, topology, 120)
    assert schedule(7, topology, 120) != schedule(8, topology, 120)


@pytest.mark.parametrize("topology", ["single", "cluster"])
@pytest.mark.parametrize("window_s", [40.0, 120.0])
def test_each_run_has_service_and_worker_faults_inside_the_window(topology: str,
                                                                   window_s: float) -> None:
    for seed in range(1, 50):
        plan = schedule(seed, topology, window_s)
        kinds = {f.kind for f in plan}
        assert kinds & set(SERVICE_FAULTS[topology]), seed
        assert kinds & set(WORKER_FAULTS), seed
        assert all(0 < f.at_s < window_s and f.hold_s >= 0 for f in plan), seed
        assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)


@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_fifteen_full_mode_seeds_strike_every_fault_of_the_topology(topology: str) -> None:
    struck = {f.kind for seed in range(1, 16) for f in schedule(seed, topology, 120)}
    assert struck == (set(WORKER_FAULTS) | set(SERVICE_FAULTS[topology]) | set(NET_FAULTS)
                      | set(CLOCK_FAULTS) | set(SPLIT_BRAIN[topology]))
