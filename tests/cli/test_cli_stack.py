"""``eoguard-dev stack up|down|status`` on the running local stack (never stopped here)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_stack_status(run_dev, stack, as_json) -> None:
    data = as_json(run_dev("--json", "stack", "status"))
    assert set(data) == {"kafka", "redis", "schema_registry"}
    assert data["schema_registry"]["address"] == stack.schema_registry_url
    assert data["kafka"]["address"] == stack.kafka_bootstrap
    assert data["redis"]["address"] == stack.redis_url
    if stack.redis_managed:
        assert data["redis"]["ready"] is True
        assert data["redis"]["pid"] > 0
    table = run_dev("stack", "status")
    assert table.exit_code == 0
    assert "kafka" in table.stdout
    assert stack.kafka_bootstrap in table.stdout


def test_stack_up_is_idempotent(run_dev, stack, as_json) -> None:
    data = as_json(run_dev("stack", "up", "--json"))
    assert data["started"] == []  # already running
    assert data["kafka_bootstrap"] == stack.kafka_bootstrap
    assert data["env"]["EOGUARD_REDIS_URL"] == stack.redis_url
    assert data["env"]["EOGUARD_SCHEMA_REGISTRY_URL"] == stack.schema_registry_url


def test_stack_down_dry_run_stops_nothing(run_dev, stack, as_json) -> None:
    data = as_json(run_dev("--json", "stack", "down", "--dry-run", "--clean"))
    assert data["dry_run"] is True
    assert data["stopped"] == []
    expected = [n for n, m in (("kafka", stack.kafka_managed), ("redis", stack.redis_managed),
                               ("schema_registry", stack.schema_registry_managed)) if m]
    assert data["would_stop"] == expected
    assert as_json(run_dev("--json", "stack", "status"))["kafka"]["ready"] in (True, None)


def test_stack_down_clean_asks_first(run_dev, stack, as_json) -> None:
    result = run_dev("stack", "down", "--clean", input="n\n")
    assert result.exit_code == 1  # declined: nothing stopped
    assert as_json(run_dev("--json", "stack", "status"))["redis"]["ready"] in (True, None)
