"""``eoguard status`` against real Redis holding known state (written by the store wrappers)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.cluster
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
    assert dd["claim_keys"] == 4
    assert dd["claims"] == {"done": 2, "in-progress": 1, "free": 1, "partial": 0}
    # billing-1 (done) has a record per shard its two claims are on; billing-2 and shipping-1 one.
    assert dd["batch_records"] == seeded.done_records + 2
    assert dd["batches"] == {"open": 1, "lapsed": 1, "done": seeded.done_records}
    assert dd["by_scope"] == {
        "billing": {"claims": {"done": 2, "in-progress": 1, "free": 0, "partial": 0},
                    "batches": {"open": 1, "lapsed": 0, "done": seeded.done_records}},
        "shipping": {"claims": {"done": 0, "in-progress": 0, "free": 1, "partial": 0},
                     "batches": {"open": 0, "lapsed": 1, "done": 0}},
    }
    assert dd["v1_keys"] == 0
    assert list(data["live"]["producers"]) == ["p-live"]
    assert data["live"]["consumers"] == {}
    # 5 records + 4 claim keys + their batch records + the shard indexes + the producer lease set
    assert data["keys"] > 5 + 4 + dd["batch_records"] + 1
    assert data["memory_bytes"] > ob["memory_bytes"] + dd["memory_bytes"]
    print(f"status counted {dd['claim_keys']} claim keys, {dd['batch_records']} batch records")


def test_status_scope_filter_and_subcommand_json_flag(run_cli, seeded, as_json) -> None:
    data = as_json(run_cli("status", "--scope", "shipping", "--no-memory", "--json"))
    assert data["dedup"]["by_scope"] == {
        "shipping": {"claims": {"done": 0, "in-progress": 0, "free": 1, "partial": 0},
                     "batches": {"open": 0, "lapsed": 1, "done": 0}}}
    assert (data["dedup"]["claim_keys"], data["dedup"]["batch_records"]) == (1, 1)
    assert data["memory_bytes"] is None
    assert data["outbox"]["records"] == 5  # the scope filters dedup keys only


def test_status_table(run_cli, seeded) -> None:
    result = run_cli("status")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("outbox records", "pending / published", "4 / 1", "orders", "refunds",
                 "billing", "shipping", "p-live", "claim keys",
                 "done / in progress / free / partial", "2 / 1 / 1 / 0", "batch records",
                 "open / lease lapsed / done", f"1 / 1 / {seeded.done_records}"):
        assert text in out, text
    assert "v1 dedup keys" not in out  # shown only when some are left
    print(out)


def test_status_counts_dedup_keys_of_layout_version_1(run_cli, redis_client, key_prefix,
                                                      as_json) -> None:
    redis_client.hset(f"{key_prefix}:meta:{{layout}}", "shards", 16)  # a version 1 record
    legacy = [f"{key_prefix}:dd:{{billing/{i}}}:id-{i}" for i in range(3)]
    for name in legacy:
        redis_client.set(name, "d|1|x", px=60_000)
    data = as_json(run_cli("--json", "status", "--scope", "other"))  # whatever the scope
    assert data["layout"] == {"version": 1, "shards": 16, "max_ttl_ms": None}
    assert data["dedup"]["v1_keys"] == 3
    assert data["dedup"]["claim_keys"] == 0
    table = run_cli("status")
    assert table.exit_code == 0, table.output
    line = next(line for line in table.stdout.splitlines() if "v1 dedup keys left" in line)
    assert "3" in line
    assert "version 1, 16 shards" in table.stdout


def test_status_of_an_empty_prefix(run_cli, as_json) -> None:
    data = as_json(run_cli("--json", "status"))
    assert data["layout"] is None
    assert data["outbox"]["records"] == 0
    assert data["outbox"]["oldest_pending_age_ms"] is None
    assert (data["dedup"]["claim_keys"], data["dedup"]["batch_records"]) == (0, 0)
    assert data["dedup"]["by_scope"] == {}
    result = run_cli("status")
    assert result.exit_code == 0
    assert "outbox records" in result.stdout
    assert "not recorded" in result.stdout
