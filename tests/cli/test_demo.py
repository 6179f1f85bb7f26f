"""``eoguard-dev demo`` end to end on the real stack (Kafka, Redis; Spark in the spark-marked test).

The demo SIGKILLs its own producer and consumer subprocesses, never the shared stack.
"""

from __future__ import annotations

import pytest

from eoguard.demo import spark_available
from eoguard.demo.report import sparkline

pytestmark = pytest.mark.integration

MESSAGES = 1500


def check_invariants(data: dict, scopes: set[str]) -> None:
    assert data["ok"] is True, data["failures"]
    assert data["failures"] == []
    assert data["messages"] == MESSAGES
    assert data["sent"] == MESSAGES
    # Crashes happened mid-way: p1 after some guarantees, c1 after some handlings.
    assert 0 < data["producer_killed_after"] < MESSAGES
    assert 0 < data["consumer_killed_after"] < MESSAGES
    assert data["guaranteed"] >= data["producer_killed_after"]
    assert data["guaranteed"] + data["failed"] <= data["sent"]
    assert data["duplicates_injected"] > 0
    assert data["expired_injected"] == 7
    assert data["malformed_injected"] == 9 == data["malformed_dead_lettered"]
    assert data["dead_lettered"] >= 9
    assert {s["scope"] for s in data["scopes"]} == scopes
    for scope in data["scopes"]:
        assert scope["lost"] == 0, scope
        assert scope["handled_twice"] == 0, scope
        assert scope["expired_handled"] == 0, scope
        assert scope["guaranteed_handled"] == data["guaranteed"]
        assert scope["expired_dropped"] >= 1
        assert scope["duplicates_dropped"] >= 1
    # p2 ran in delayed mode and its delay and avoided writes were sampled over the run.
    delayed = data["delayed"]
    assert 0 < delayed["sent"] < MESSAGES
    assert delayed["avoided"] + delayed["persisted"] >= delayed["sent"]
    assert delayed["avoided"] > 0
    assert len(delayed["delay_ms"]) == len(delayed["seconds"]) >= 1
    assert sum(delayed["avoided_per_sample"]) <= delayed["avoided"]


def test_sparkline_scales_to_the_largest_value() -> None:
    assert sparkline([0, 1, 2, 4, 8]) == "▁▂▃▅█"
    assert sparkline([5.0] * 200, width=50) == "█" * 50
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([]) == ""


@pytest.mark.cluster
def test_demo_without_spark(run_dev, as_json, topology: str) -> None:
    result = run_dev("--json", "demo", "--messages", str(MESSAGES), "--no-spark",
                     "--topology", topology)
    data = as_json(result)
    check_invariants(data, {"orders"})
    assert data["spark"].startswith("off")
    print(f"demo {MESSAGES} messages without Spark on the {topology} topology: "
          f"{data['elapsed_s']} s")


@pytest.mark.spark
def test_demo_with_spark(run_dev, as_json) -> None:
    available, why = spark_available()
    if not available:
        pytest.fail(f"the Spark job cannot run: {why}", pytrace=False)
    result = run_dev("--json", "demo", "--messages", str(MESSAGES), "--spark")
    data = as_json(result)
    check_invariants(data, {"orders", "orders-spark"})
    assert data["spark"] == "ran"
    print(f"demo {MESSAGES} messages with Spark: {data['elapsed_s']} s")


def test_demo_rejects_bad_options(run_dev) -> None:
    result = run_dev("demo", "--messages", "5")
    assert result.exit_code == 2
    assert "--messages" in result.stderr
