"""The one percentile rule every benchmark reports by: the nearest rank, never interpolated."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile", "rank"]


def rank(n: int, q: float) -> int:
    """The index of the ``q`` quantile (0 <= q <= 1) in a sorted sequence of ``n`` values."""
    return min(n - 1, int(n * q))


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 <= q <= 1) of ``ordered``, sorted ascending; NaN when empty."""
    return ordered[rank(len(ordered), q)] if ordered else float("nan")
