"""Retry waits are jittered within bounds (seeded generators: the same draws every run)."""

from __future__ import annotations

import random

import pytest

from eoguard import backoff
from eoguard.backoff import doubling_s, jittered


def test_a_jittered_wait_stays_in_the_upper_half_of_the_rule() -> None:
    rng = random.Random(40)
    draws = [jittered(2.0, rng) for _ in range(2_000)]
    assert all(1.0 <= d <= 2.0 for d in draws)
    # Spread over the whole half, not one value: processes that failed together retry apart.
    assert min(draws) < 1.05
    assert max(draws) > 1.95
    assert len(set(draws)) == len(draws)


def test_the_same_seed_draws_the_same_waits() -> None:
    first, second = random.Random(7), random.Random(7)
    assert [jittered(1.0, first) for _ in range(10)] == [jittered(1.0, second) for _ in range(10)]


def test_without_a_generator_the_random_modules_own_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module's generator is the one CPython reseeds in a forked child.
    monkeypatch.setattr(backoff.random, "random", lambda: 1.0)
    assert jittered(0.4) == pytest.approx(0.4)
    monkeypatch.setattr(backoff.random, "random", lambda: 0.0)
    assert jittered(0.4) == pytest.approx(0.2)


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 0.2), (2, 0.4), (3, 0.8), (6, 5.0),
                                                  (5_000, 5.0)])
def test_a_doubling_wait_is_capped_and_jittered_below_its_step(attempt: int,
                                                               ceiling: float) -> None:
    rng = random.Random(attempt)
    for _ in range(200):
        assert ceiling / 2 <= doubling_s(0.2, attempt, 5.0, rng) <= ceiling
