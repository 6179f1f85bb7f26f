"""``eoguard dedup check|forget`` against real Redis holding known claim keys and batch records."""

from __future__ import annotations

import time

import pytest
import redis

from eoguard.envelope import new_message_id
from eoguard.store.dedup import ClaimResult, DedupStore, DoneResult, Effect, position

pytestmark = pytest.mark.integration


def test_check_done_in_progress_and_free(run_cli, seeded, as_json) -> None:
    done = as_json(run_cli("--json", "dedup", "check", seeded.done[0], "--scope", "billing"))
    assert done["state"] == "done"
    assert done["scope"] == "billing"
    assert (done["claim"], done["token"]) == ("claimed", "billing-1")
    assert done["position"] == {"reader": "billing-app", "topic": "orders", "partition": 0,
                                "offset": 0}
    assert done["batch"]["state"] == "done"
    assert done["batch"]["done_at"] is not None
    assert done["batch"]["lease_left_ms"] is None
    assert done["batch"]["key"].endswith(":billing-1")
    assert 600_000 < done["ttl_left_ms"] <= 660_000  # expires_at + the default grace

    live = as_json(run_cli("--json", "dedup", "check", seeded.claimed_live, "-s", "billing"))
    assert (live["state"], live["token"], live["batch"]["state"]) == ("in-progress", "billing-2", "open")
    assert 0 < live["batch"]["lease_left_ms"] <= 60_000
    assert live["batch"]["done_at"] is None
    assert live["position"]["offset"] == 2

    lapsed = as_json(run_cli("dedup", "check", seeded.claimed_lapsed, "--scope", "shipping", "--json"))
    assert (lapsed["state"], lapsed["batch"]["state"]) == ("free", "open")
    assert lapsed["batch"]["lease_left_ms"] <= 0
    assert lapsed["position"] == {"reader": "shipping-app", "topic": "refunds", "partition": 1,
                                  "offset": 5}

    table = run_cli("dedup", "check", seeded.done[0], "--scope", "billing")
    assert table.exit_code == 0, table.output
    for text in ("state", "done", "billing-1", "billing-app", "orders", "batch record",
                 "done at", "ttl left"):
        assert text in table.stdout, text
    print(table.stdout)
    table = run_cli("dedup", "check", seeded.claimed_lapsed, "--scope", "shipping")
    assert table.exit_code == 0, table.output
    assert "free" in table.stdout
    assert "lapsed" in table.stdout
    assert "ago" in table.stdout


def test_check_a_claim_whose_batch_record_is_gone(run_cli, redis_client, seeded, as_json) -> None:
    store = DedupStore(redis_client, scope="billing", keys=seeded.keys)
    entry = store.check(seeded.claimed_live)
    assert entry is not None
    assert entry.batch is not None
    assert redis_client.delete(entry.batch.key) == 1
    info = as_json(run_cli("--json", "dedup", "check", seeded.claimed_live, "-s", "billing"))
    assert (info["state"], info["batch"], info["token"]) == ("free", None, "billing-2")
    table = run_cli("dedup", "check", seeded.claimed_live, "-s", "billing")
    assert table.exit_code == 0, table.output
    assert "missing" in table.stdout


@pytest.mark.denied("-sadd")
def test_check_a_partial_claim(run_cli, limited_client: redis.Redis, seeded, as_json) -> None:
    # An effect refused after the check passed, midway: the claim key is marked PARTIAL.
    store = DedupStore(limited_client, scope="billing", keys=seeded.keys)
    message_id = new_message_id()
    claim = store.new_claim(message_id, position("billing-app", "orders", 3, 9),
                            int(time.time() * 1000) + 600_000)
    assert store.claim("billing-3", [claim])[0].result is ClaimResult.NEW
    effects = {message_id: [Effect("INCRBY", store.effect_key(message_id, "n"), (1,)),
                            Effect("SADD", store.effect_key(message_id, "s"), ("m",))]}
    assert store.done("billing-3", [claim], effects=effects)[0].result is DoneResult.PARTIAL
    info = as_json(run_cli("--json", "dedup", "check", message_id, "-s", "billing"))
    assert (info["state"], info["claim"], info["token"]) == ("partial", "partial", "billing-3")
    assert info["position"]["partition"] == 3


def test_check_unknown_in_scope(run_cli, seeded) -> None:
    result = run_cli("dedup", "check", seeded.done[0], "--scope", "shipping")
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert "no claim key" in result.stderr
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
    assert store.check(seeded.done[1]) is None
    no_prompt = run_cli("--json", "dedup", "forget", seeded.claimed_live, "-s", "billing")
    assert no_prompt.exit_code == 2
    assert "--yes" in no_prompt.stderr
    assert store.check(seeded.claimed_live) is not None
    gone = run_cli("dedup", "forget", seeded.done[0], "--scope", "billing", "--yes")
    assert gone.exit_code == 3
