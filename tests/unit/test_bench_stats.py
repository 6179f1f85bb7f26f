"""The benchmarks' one percentile rule (bench/stats.py): nearest rank, never past the end."""

from __future__ import annotations

import math

from bench.stats import percentile, rank


def test_nearest_rank_of_a_hundred_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile(values, 0.0) == 1.0


def test_a_quantile_never_indexes_past_the_last_value() -> None:
    assert rank(1, 0.999) == 0
    assert rank(10, 1.0) == 9
    assert percentile([3.0, 7.0], 1.0) == 7.0


def test_no_values_give_nan() -> None:
    assert math.isnan(percentile([], 0.5))
