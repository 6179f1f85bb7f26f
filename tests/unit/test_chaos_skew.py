"""What the chaos checker lets a skewed clock leave unhandled (tests/fault/chaos/checker.py,
docs/design.md §5 Clocks): no more than the design says."""

from __future__ import annotations

from tests.fault.chaos.checker import skewed_out
from tests.fault.chaos.clock import Skew

DRAINED = 1_000_000


def test_a_consumer_ahead_excuses_what_it_saw_expired_in_its_scope_alone() -> None:
    ahead = Skew("c1", "consumer", "orders", 120_000, from_ms=500_000, to_ms=600_000)
    expires = {"seen-expired": 700_000, "too-late": 720_001, "later": 900_000}
    assert skewed_out([ahead], "orders", set(expires), expires, DRAINED) == {"seen-expired"}
    assert skewed_out([ahead], "billing", set(expires), expires, DRAINED) == set()


def test_a_consumer_behind_excuses_nothing() -> None:
    behind = Skew("c1", "consumer", "orders", -120_000, from_ms=500_000, to_ms=600_000)
    expires = {"a": 550_000, "b": 700_000}
    assert skewed_out([behind], "orders", set(expires), expires, DRAINED) == set()


def test_a_producer_behind_excuses_its_expired_messages_not_its_live_ones() -> None:
    behind = Skew("p1", "producer", None, -90_000, 500_000, 600_000, ids={"short-lived", "live"})
    expires = {"short-lived": 900_000, "live": 1_100_000, "other": 900_000}
    assert skewed_out([behind], "orders", set(expires), expires, DRAINED) == {"short-lived"}


def test_a_producer_ahead_excuses_nothing() -> None:
    ahead = Skew("p1", "producer", None, 90_000, 500_000, 600_000, ids={"a"})
    assert skewed_out([ahead], "orders", {"a"}, {"a": 900_000}, DRAINED) == set()
