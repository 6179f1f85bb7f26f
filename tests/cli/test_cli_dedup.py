"""``eoguard dedup check|forget`` against real Redis holding known dedup keys."""

from __future__ import annotations

import pytest

from eoguard.store.dedup import DedupStore

pytestmark = pytest.mark.integration


def test_check_done_and_claimed(run_cli, seeded, as_json) -> None:
    done = as_json(run_cli("--json", "dedup", "check", seeded.done[0], "--scope", "billing"))
    assert done["state"] == "done"
    assert done["scope"] == "billing"
    assert done["owner"] == "billing|billing-app|orders|0|0"
    assert done["done_at"] is not None
    assert done["lease_left_ms"] is None
    assert 600_000 < done["ttl_left_ms"] <= 660_000  # expires_at + the default grace

    live = as_json(run_cli("--json", "dedup", "check", seeded.claimed_live, "-s", "billing"))
    assert live["state"] == "claimed"
    assert 0 < live["lease_left_ms"] <= 60_000
    assert live["lease_lapsed"] is False
    lapsed = as_json(run_cli("dedup", "check", seeded.claimed_lapsed, "--scope", "shipping", "--json"))
    assert lapsed["lease_lapsed"] is True
    assert lapsed["owner"] == "shipping|shipping-app|refunds|1|5"

    table = run_cli("dedup", "check", seeded.done[0], "--scope", "billing")
    assert table.exit_code == 0, table.output
    for text in ("done", "billing|billing-app|orders|0|0", "ttl left"):
        assert text in table.stdout


def test_check_unknown_in_scope(run_cli, seeded) -> None:
    result = run_cli("dedup", "check", seeded.done[0], "--scope", "shipping")
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert "no dedup key" in result.stderr
    missing_scope = run_cli("dedup", "check", seeded.done[0])
    assert missing_scope.exit_code == 2
    assert "--scope" in missing_scope.stderr


def test_forget_asks_then_deletes(run_cli, redis_client, seeded, as_json) -> None:
    store = DedupStore(redis_client, scope="billing", keys=seeded.keys)
    dry = as_json(run_cli("--json", "dedup", "forget", seeded.done[0], "-s", "billing", "--dry-run"))
    assert dry["deleted"] is False
    assert dry["entry"]["state"] == "done"
    declined = run_cli("dedup", "forget", seeded.done[0], "--scope", "billing", input="n\n")
    assert declined.exit_code == 1
    assert store.check(seeded.done[0]) is not None

    accepted = run_cli("dedup", "forget", seeded.done[0], "--scope", "billing", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "forgot" in accepted.stdout
    assert store.check(seeded.done[0]) is None
    assert store.check(seeded.done[1]) is not None  # only the named key

    scripted = as_json(run_cli("--json", "dedup", "forget", seeded.done[1], "-s", "billing", "--yes"))
    assert scripted["deleted"] is True
    no_prompt = run_cli("--json", "dedup", "forget", seeded.claimed_live, "-s", "billing")
    assert no_prompt.exit_code == 2
    assert "--yes" in no_prompt.stderr
    gone = run_cli("dedup", "forget", seeded.done[0], "--scope", "billing", "--yes")
    assert gone.exit_code == 3
