"""``eoguard status`` against real Redis holding known state (written by the store wrappers)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_status_json_counts_everything(run_cli, seeded, as_json) -> None:
    data = as_json(run_cli("--json", "status"))
    ob, dd = data["outbox"], data["dedup"]
    assert ob["records"] == 5
    assert (ob["pending"], ob["published"]) == (4, 1)
    assert ob["by_topic"] == {"orders": {"pending": 2, "published": 1},
                              "refunds": {"pending": 2, "published": 0}}
    assert ob["past_resend_time"] == 0  # resend_after is 10 minutes
    assert 0 <= ob["oldest_pending_age_ms"] < 60_000
    assert ob["memory_bytes"] > 0
    assert dd["keys"] == 4
    assert dd["by_scope"] == {"billing": {"claimed": 1, "done": 2, "lapsed": 0},
                              "shipping": {"claimed": 1, "done": 0, "lapsed": 1}}
    assert dd["lapsed_claims"] == 1
    assert list(data["live"]["producers"]) == ["p-live"]
    assert data["live"]["consumers"] == {}
    # 5 records + 4 dedup keys + the shard indexes holding them + the producer lease set
    assert data["keys"] > 5 + 4 + 1
    assert data["memory_bytes"] > ob["memory_bytes"] + dd["memory_bytes"]


def test_status_scope_filter_and_subcommand_json_flag(run_cli, seeded, as_json) -> None:
    data = as_json(run_cli("status", "--scope", "shipping", "--no-memory", "--json"))
    assert data["dedup"]["by_scope"] == {"shipping": {"claimed": 1, "done": 0, "lapsed": 1}}
    assert data["memory_bytes"] is None
    assert data["outbox"]["records"] == 5  # the scope filters dedup keys only


def test_status_table(run_cli, seeded) -> None:
    result = run_cli("status")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("outbox records", "pending / published", "4 / 1", "orders", "refunds",
                 "billing", "shipping", "p-live", "claims with lapsed lease"):
        assert text in out, text


def test_status_of_an_empty_prefix(run_cli, as_json) -> None:
    data = as_json(run_cli("--json", "status"))
    assert data["outbox"]["records"] == 0
    assert data["outbox"]["oldest_pending_age_ms"] is None
    assert data["dedup"]["keys"] == 0
    result = run_cli("status")
    assert result.exit_code == 0
    assert "outbox records" in result.stdout
