"""Invariant 6 as the chaos checker holds each key and message to it (tests/fault/chaos/checker.py,
docs/design.md §4 and §5 Clocks): every bound bites, and a value at its bound passes."""

from __future__ import annotations

from tests.fault.chaos.checker import judge_lifetimes

MAX_TTL = 330_000
GRACE = 3_000
ALLOWANCE = 3_000  # the clock-skew allowance, capped at the grace
SENT = 1_700_000_000_000  # real ms
NOW = SENT + 10_000  # Redis's clock when the keys are read


def _id(created_ms: int, n: int = 1) -> str:
    """A UUIDv7 created at ``created_ms``."""
    hexed = f"{created_ms:012x}7000a000{n:012x}"
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


def _judge(ttls: list[tuple[str, int]], expires: dict[str, int],
           skew_of: dict[str, int] | None = None) -> list[str]:
    return judge_lifetimes(ttls, NOW, MAX_TTL, GRACE, expires, skew_of or {}).violations


def test_a_key_living_past_its_kinds_bound_breaks_it_at_the_bound_it_passes() -> None:
    m = _id(NOW)  # sent as the keys are read, with the longest TTL
    expires = {m: NOW + MAX_TTL}
    claim, record = f"p:dc:{{orders/3}}:{m}", f"p:ob:{{3}}:r:{m}"
    batch, index = "p:db:{orders/3}:tok", "p:ob:{3}:idx"
    assert _judge([(batch, MAX_TTL + GRACE), (index, MAX_TTL)], expires) == []
    broken = _judge([(batch, MAX_TTL + GRACE + 1), (index, MAX_TTL + 1)], expires)
    assert len(broken) == 2
    assert all("past its bound" in v for v in broken)
    # an outbox record has no grace: its PTTL bound is max_ttl itself
    assert any("PTTL" in v for v in _judge([(record, MAX_TTL + 1)], expires))
    assert not any("PTTL" in v for v in _judge([(claim, MAX_TTL + GRACE)], expires))


def test_a_key_expiring_past_its_messages_expiry_breaks_it() -> None:
    m = _id(SENT)
    at = SENT + 180_000
    claim, record = f"p:dc:{{orders/3}}:{m}", f"p:ob:{{3}}:r:{m}"
    assert _judge([(claim, at + GRACE - NOW), (record, at - NOW)], {m: at}) == []
    broken = _judge([(claim, at + GRACE - NOW + 1), (record, at - NOW + 1)], {m: at})
    assert len(broken) == 2
    assert all("past its message's bound" in v for v in broken)


def test_only_the_layout_record_may_live_without_a_ttl() -> None:
    assert _judge([("p:meta:{layout}", -1), ("p:ob:{1}:idx", -2)], {}) == []
    assert _judge([("p:live:{consumers}", -1)], {}) == ["invariant 6: p:live:{consumers} has no TTL"]


def test_a_message_of_a_producer_ahead_lives_at_most_max_ttl_plus_the_allowance() -> None:
    ahead = 150_000  # its clock, so its UUIDv7 time, runs this far ahead of the real one
    clamped, unclamped = _id(SENT + ahead, 1), _id(SENT + ahead, 2)
    expires = {clamped: SENT + MAX_TTL + ALLOWANCE, unclamped: SENT + ahead + 271_000}
    skews = {clamped: ahead, unclamped: ahead}
    result = judge_lifetimes([], NOW, MAX_TTL, GRACE, expires, skews)
    assert result.clamped == 1
    assert result.violations == [f"invariant 6: message {unclamped} expires {ahead + 271_000} ms "
                                 f"after it was sent, past max_ttl plus the allowance"]
    # the same expiry from a producer in step is the TTL it asked for, within the bound
    assert _judge([], {_id(SENT + ahead - MAX_TTL): SENT + ahead}) == []
