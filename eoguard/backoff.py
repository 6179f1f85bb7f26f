"""Every wait before a retry, jittered here: processes that failed together (a Redis failover
under every consumer of a group) retry spread out, not in lockstep.

A wait is drawn uniformly from its upper half: never longer than the rule asked (the caps and
the bounds callers state hold), never shorter than half of it (a retry still backs off).
"""

from __future__ import annotations

import random

__all__ = ["doubling_s", "jittered"]


def jittered(wait_s: float, rng: random.Random | None = None) -> float:
    """A wait drawn from ``[wait_s / 2, wait_s]``.

    Draws from the ``random`` module's own generator unless ``rng`` is given (a seeded one, in
    tests); that generator is seeded afresh in a forked child, so forked workers differ too.
    """
    draw = rng.random() if rng is not None else random.random()  # noqa: S311 (not a secret)
    return wait_s * (0.5 + draw / 2)


def doubling_s(base_s: float, attempt: int, cap_s: float,
               rng: random.Random | None = None) -> float:
    """The jittered wait before retry ``attempt`` (1 first): ``base_s`` doubling, at most
    ``cap_s``."""
    return jittered(min(base_s * 2 ** min(attempt - 1, 64), cap_s), rng)  # 2**64: past any cap
