"""The demo's invariant checks (pure logic): a broken invariant is reported, a clean run is not."""

from __future__ import annotations

from eoguard.demo.report import DemoReport, check, scope_result


def report_with(counts: dict[str, int], *, guaranteed: set[str], expired: list[str],
                late: int = 0) -> DemoReport:
    report = DemoReport(run_id="r", topic="t", prefix="p", messages=3, guaranteed=len(guaranteed))
    report.scopes.append(scope_result(scope="orders", engine="GuardedConsumer", counts=counts,
                                      guaranteed=guaranteed, expired_ids=expired, late=late))
    return report


def test_clean_run_has_no_failures() -> None:
    report = report_with({"a": 1, "b": 1, "x": 1}, guaranteed={"a", "b"}, expired=["e"])
    check(report, malformed_positions=[(0, 5)], dead_positions=[(0, 5), (1, 2)])
    assert report.ok
    assert report.failures == []
    scope = report.scopes[0]
    assert (scope.handled, scope.guaranteed_handled, scope.lost) == (3, 2, 0)


def test_each_broken_invariant_is_named() -> None:
    report = report_with({"a": 2, "e": 1}, guaranteed={"a", "b"}, expired=["e"], late=1)
    check(report, malformed_positions=[(0, 5), (0, 6)], dead_positions=[(0, 5)])
    assert not report.ok
    text = "\n".join(report.failures)
    assert "1 guaranteed message(s) lost" in text
    assert "'b'" in text
    assert "1 message(s) handled twice" in text
    assert "'a'" in text
    assert "2 expired message(s) handled" in text  # one expired id + one late handling
    assert "1 malformed record(s) not on the dead-letter topic: [(0, 6)]" in text
    assert report.as_dict()["ok"] is False


def test_nothing_guaranteed_is_a_failure() -> None:
    report = report_with({}, guaranteed=set(), expired=[])
    check(report, malformed_positions=[], dead_positions=[])
    assert report.failures == ["no message was guaranteed: the producers did not run"]
