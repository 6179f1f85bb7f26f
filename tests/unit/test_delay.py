"""The adaptive delay policy: pure logic, no services."""

from __future__ import annotations

import pytest

from eoguard.producer.delay import DelayInputs, DelayPolicy, LatencyWindow

POLICY = DelayPolicy(min_ms=20, max_ms=1000, max_messages=10_000, max_bytes=10_000_000)


def inputs(**kw) -> DelayInputs:
    base = {"ack_p50_ms": 5.0, "ack_p99_ms": 40.0, "live_producers": 1,
            "backlog_messages": 0, "backlog_bytes": 0}
    return DelayInputs(**{**base, **kw})


def test_no_latency_observed_yet_waits_the_maximum() -> None:
    assert POLICY.delay_ms(inputs(ack_p50_ms=None, ack_p99_ms=None)) == 1000


def test_delay_follows_the_p99_ack_latency_with_headroom() -> None:
    assert POLICY.delay_ms(inputs(ack_p99_ms=40.0)) == 80.0
    assert POLICY.delay_ms(inputs(ack_p99_ms=100.0)) == 200.0
    assert POLICY.delay_ms(inputs(ack_p50_ms=60.0, ack_p99_ms=50.0)) == 120.0  # p50 floor


def test_delay_is_clamped_to_min_and_max() -> None:
    assert POLICY.delay_ms(inputs(ack_p50_ms=0.5, ack_p99_ms=1.0)) == 20
    assert POLICY.delay_ms(inputs(ack_p99_ms=5_000.0)) == 1000


def test_more_live_producers_wait_longer_up_to_a_cap() -> None:
    one = POLICY.delay_ms(inputs(live_producers=1))
    three = POLICY.delay_ms(inputs(live_producers=3))
    many = POLICY.delay_ms(inputs(live_producers=100))
    assert one < three < many
    assert three == pytest.approx(one * 1.2)
    assert many == pytest.approx(one * POLICY.max_contention)
    assert POLICY.delay_ms(inputs(live_producers=0)) == one  # not registered yet


def test_memory_pressure_shrinks_the_delay_towards_the_minimum() -> None:
    calm = POLICY.delay_ms(inputs(ack_p99_ms=400.0, backlog_messages=4_000))
    assert calm == 800.0  # below pressure_start: untouched
    half_way = POLICY.delay_ms(inputs(ack_p99_ms=400.0, backlog_messages=7_500))
    assert half_way == pytest.approx(20 + (800 - 20) * 0.5)
    by_bytes = POLICY.delay_ms(inputs(ack_p99_ms=400.0, backlog_bytes=7_500_000))
    assert by_bytes == half_way
    assert POLICY.delay_ms(inputs(ack_p99_ms=400.0, backlog_messages=10_000)) == 20
    assert POLICY.delay_ms(inputs(ack_p99_ms=400.0, backlog_messages=20_000)) == 20
    # Pressure applies even before any latency is known.
    full = POLICY.delay_ms(inputs(ack_p50_ms=None, ack_p99_ms=None, backlog_messages=9_000))
    assert full == pytest.approx(20 + (1000 - 20) * 0.2)


def test_delay_is_monotonic_in_latency() -> None:
    delays = [POLICY.delay_ms(inputs(ack_p50_ms=1.0, ack_p99_ms=float(p))) for p in range(0, 800)]
    assert delays == sorted(delays)


@pytest.mark.parametrize("kw", [{"min_ms": 0}, {"min_ms": 50, "max_ms": 10},
                                {"max_messages": 0}, {"pressure_start": 1.0}])
def test_invalid_policy_is_refused(kw) -> None:
    args = {"min_ms": 20, "max_ms": 1000, "max_messages": 10, "max_bytes": 10, **kw}
    with pytest.raises(ValueError):
        DelayPolicy(**args)


def test_latency_window_percentiles() -> None:
    window = LatencyWindow(size=100)
    assert window.percentiles(50, 99) == (None, None)
    for v in range(1, 201):  # only the last 100 (101..200) are kept
        window.add(float(v))
    assert len(window) == 100
    assert window.percentiles(50, 99, 100) == (150.0, 199.0, 200.0)
    assert window.percentiles(0) == (101.0,)
