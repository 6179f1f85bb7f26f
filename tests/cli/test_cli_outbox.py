"""``eoguard outbox list|show|resend|purge`` against real Redis (and real Kafka for resend)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.codec.headers import write_headers
from eoguard.codec.registry_payloads import frame
from eoguard.codec.schemas import SCHEMA_DIR_ENV, _default_registry
from eoguard.config import KeepUntil
from eoguard.store.keys import KeySpace
from eoguard.store.layout import check_layout, recorded_layout
from eoguard.store.outbox import Outbox, RecordState
from tests.cli.conftest import ORDER, outbox_record
from tests.schema_versions import schema_dir

pytestmark = pytest.mark.integration


@pytest.mark.cluster
def test_list_json_filters(run_cli, seeded, as_json) -> None:
    data = as_json(run_cli("--json", "outbox", "list"))
    assert data["matched"] == 5
    ids = {r["id"] for r in data["records"]}
    assert ids == {seeded.published, *seeded.live_pending, *seeded.stuck}
    ages = [r["age_ms"] for r in data["records"]]
    assert ages == sorted(ages, reverse=True)  # oldest first

    refunds = as_json(run_cli("--json", "outbox", "list", "--topic", "refunds"))
    assert {r["id"] for r in refunds["records"]} == set(seeded.stuck)
    published = as_json(run_cli("--json", "outbox", "list", "--state", "published"))
    assert [r["id"] for r in published["records"]] == [seeded.published]
    stuck = as_json(run_cli("--json", "outbox", "list", "--stuck"))
    assert {r["id"] for r in stuck["records"]} == set(seeded.stuck)
    assert all(r["stuck"] and not r["owner_live"] for r in stuck["records"])
    assert as_json(run_cli("--json", "outbox", "list", "--older-than", "1h"))["matched"] == 0
    limited = as_json(run_cli("--json", "outbox", "list", "--limit", "2"))
    assert (limited["matched"], limited["shown"]) == (5, 2)


def test_list_table(run_cli, seeded) -> None:
    result = run_cli("outbox", "list", "--topic", "refunds")
    assert result.exit_code == 0, result.output
    assert "2 matched" in result.stdout
    for message_id in seeded.stuck:
        assert message_id in result.stdout
    assert "p-gone (gone)" in result.stdout


def test_list_rejects_a_bad_duration(run_cli) -> None:
    result = run_cli("outbox", "list", "--older-than", "soon")
    assert result.exit_code == 2
    assert "not a duration" in result.stderr


def test_show_decodes_envelope_and_payload(run_cli, seeded, as_json) -> None:
    data = as_json(run_cli("--json", "outbox", "show", seeded.stuck[0]))
    rec, env, payload = data["record"], data["envelope"], data["payload"]
    assert rec["id"] == seeded.stuck[0]
    assert rec["topic"] == "refunds"
    assert rec["state"] == "pending"
    assert rec["owner"] == "p-gone"
    assert rec["owner_live"] is False
    assert 590_000 < rec["ttl_left_ms"] <= 600_000
    assert env["id"] == seeded.stuck[0]
    assert env["payload_schema"] == "eoguard.example.Order"
    assert payload["order_id"] == "order-10"
    assert payload["amount"] == "12.50"
    assert payload["currency"] == "EUR"
    assert payload["items"] == [{"sku": "sku-1", "qty": 2, "unit_price": 6.25}]
    assert data["decode_error"] is None

    table = run_cli("outbox", "show", seeded.published)
    assert table.exit_code == 0, table.output
    for text in ("published", "eoguard.example.Order", "order-0", "12.50", "ttl left"):
        assert text in table.stdout, text


def test_show_a_record_whose_value_does_not_decode(run_cli, redis_client, seeded, as_json) -> None:
    bad = dataclasses.replace(outbox_record("orders", n=99), value=b"\x00\x01not-avro")
    Outbox(redis_client, seeded.keys).put([bad], owner="p-live", keep_until=KeepUntil.CONSUMED,
                                          resend_after_ms=600_000)
    data = as_json(run_cli("--json", "outbox", "show", bad.id))
    assert data["envelope"] is None
    assert data["decode_error"].startswith("BadMagicError")
    table = run_cli("outbox", "show", bad.id)
    assert table.exit_code == 0
    assert "does not decode" in table.stdout


def test_show_a_record_in_the_header_format(run_cli, redis_client, seeded, as_json) -> None:
    """Its fields come from its headers; a framed payload shows its schema id."""
    base = outbox_record("orders", n=98)
    heads = write_headers(base.id, base.created_at_ms, base.expires_at_ms, attempt=1,
                          producer="p-live", source="/shop", schema="eoguard.example.Order",
                          app={"trace": "t-98"})
    framed = dataclasses.replace(base, value=frame(42, b"\x02x"), headers=heads)
    other = outbox_record("orders", n=97)
    raw = dataclasses.replace(other, value=b'{"n": 97}', headers=write_headers(
        other.id, other.created_at_ms, other.expires_at_ms, attempt=1, producer="p-live",
        source="/shop", schema=None, app=None))
    Outbox(redis_client, seeded.keys).put([framed, raw], owner="p-live",
                                          keep_until=KeepUntil.CONSUMED,
                                          resend_after_ms=600_000)
    data = as_json(run_cli("--json", "outbox", "show", framed.id))
    assert data["decode_error"] is None
    assert data["envelope"]["wire_format"] == "headers"
    assert data["envelope"]["id"] == framed.id
    assert data["envelope"]["headers"]["trace"] == "t-98"
    assert data["payload"] == {"schema_id": 42}
    assert as_json(run_cli("--json", "outbox", "show", raw.id))["payload"] == {
        "base64": "eyJuIjogOTd9"}
    table = run_cli("outbox", "show", framed.id)
    assert table.exit_code == 0, table.output
    assert "registry-framed" in table.stdout  # the title wraps at a word


def test_show_unknown_id(run_cli) -> None:
    result = run_cli("outbox", "show", "01900000-0000-7000-8000-000000000000")
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert "no outbox record" in result.stderr


def test_purge_expired_index_entries(run_cli, redis_client, key_prefix, seeded, as_json) -> None:
    box = Outbox(redis_client, seeded.keys)
    # Short-lived records in the shards of live ones: the records expire by TTL, their index
    # entries stay (an index whose members all expired goes with its own TTL).
    live_shards = {seeded.keys.shard_of(i) for i in seeded.live_pending}
    short = []
    while len(short) < 2:
        rec = outbox_record("orders", ttl_ms=300, n=50 + len(short))
        if seeded.keys.shard_of(rec.id) in live_shards:
            short.append(rec)
    box.put(short, owner="p-live", keep_until=KeepUntil.CONSUMED, resend_after_ms=600_000)
    time.sleep(0.5)

    dry = as_json(run_cli("--json", "outbox", "purge", "--expired", "--dry-run"))
    assert dry["dry_run"] is True
    assert sorted(dry["ids"]) == sorted(r.id for r in short)
    refused = run_cli("outbox", "purge", "--expired", input="n\n")
    assert refused.exit_code == 1  # aborted at the prompt: nothing removed
    assert sum(len(v) for v in box.pending_ids().values()) == 4 + 2

    done = run_cli("outbox", "purge", "--expired", input="y\n")
    assert done.exit_code == 0, done.output
    assert "removed 2 index entries" in done.stdout
    pending = {i for v in box.pending_ids().values() for i in v}
    assert pending == {*seeded.live_pending, *seeded.stuck}  # live records keep their entries
    again = as_json(run_cli("--json", "outbox", "purge", "--expired", "--yes"))
    assert again["count"] == 0


def test_purge_needs_the_expired_flag(run_cli) -> None:
    result = run_cli("outbox", "purge")
    assert result.exit_code == 2
    assert "--expired" in result.stderr


@pytest.mark.cluster
def test_resend_stuck_through_recovery(run_cli, redis_client, seeded, kafka_bootstrap, as_json,
                                       new_topic) -> None:
    box = Outbox(redis_client, seeded.keys)
    dry = as_json(run_cli("--json", "outbox", "resend", "--stuck", "--dry-run"))
    assert sorted(dry["candidates"]) == sorted(seeded.stuck)
    assert dry["resent"] == 0
    assert all(box.get(i).attempt == 1 for i in seeded.stuck)

    result = run_cli("--json", "outbox", "resend", "--stuck", "--yes",
                     "--bootstrap-servers", kafka_bootstrap)
    data = as_json(result)
    assert (data["claimed"], data["resent"], data["unacknowledged"]) == (2, 2, 0)
    for message_id in seeded.stuck:
        rec = box.get(message_id)
        assert rec.state is RecordState.PUBLISHED
        assert rec.attempt == 2
    for message_id in seeded.live_pending:  # owner live, not due: left alone
        assert box.get(message_id).state is RecordState.PENDING
    again = as_json(run_cli("--json", "outbox", "resend", "--stuck", "--dry-run"))
    assert again["candidates"] == []


def test_resend_on_a_prefix_laid_out_with_its_own_max_ttl(run_cli, redis_client, seeded,
                                                          kafka_bootstrap, as_json) -> None:
    # The resend's producer takes the recorded layout (shards and max_ttl), not the defaults:
    # with the defaults its layout check would refuse the prefix.
    custom = KeySpace(prefix=seeded.keys.prefix, shards=seeded.keys.shards,
                      max_ttl_ms=90 * 86_400_000)
    check_layout(redis_client, custom)
    data = as_json(run_cli("--json", "outbox", "resend", "--stuck", "--yes",
                           "--bootstrap-servers", kafka_bootstrap))
    assert (data["claimed"], data["resent"], data["unacknowledged"]) == (2, 2, 0)
    assert recorded_layout(redis_client, seeded.keys.prefix).max_ttl_ms == custom.max_ttl_ms


def test_resend_named_ids(run_cli, redis_client, seeded, kafka_bootstrap, as_json) -> None:
    box = Outbox(redis_client, seeded.keys)
    target = seeded.live_pending[0]
    result = run_cli("--json", "outbox", "resend", target, seeded.published, "--yes",
                     "--bootstrap-servers", kafka_bootstrap)
    data = as_json(result)
    assert data["candidates"] == [target]
    assert [s["id"] for s in data["skipped"]] == [seeded.published]
    assert (data["claimed"], data["resent"]) == (1, 1)
    assert box.get(target).state is RecordState.PUBLISHED
    assert box.get(target).attempt == 2


def test_resend_usage_and_unknown_id(run_cli, seeded) -> None:
    both = run_cli("outbox", "resend", seeded.stuck[0], "--stuck")
    assert both.exit_code == 2
    assert "one of the two" in both.stderr
    unknown = run_cli("outbox", "resend", "01900000-0000-7000-8000-000000000000", "--yes")
    assert unknown.exit_code == 3
    assert "no outbox record" in unknown.stderr
    declined = run_cli("outbox", "resend", seeded.stuck[0], input="n\n")
    assert declined.exit_code == 1


def test_show_resolves_an_older_payload_into_the_readers_version(
        run_cli, redis_client, seeded, as_json, tmp_path, monkeypatch) -> None:
    rec = outbox_record("orders", n=77)  # written with the checkout's Order: "older"
    env = EnvelopeCodec().decode(rec.value)
    writer = PayloadCodec().writer_fingerprint(ORDER)
    value = EnvelopeCodec().encode(dataclasses.replace(env, payload_fingerprint=writer))
    rec = dataclasses.replace(rec, value=value)
    Outbox(redis_client, seeded.keys).put([rec], owner="p-live", keep_until=KeepUntil.CONSUMED,
                                          resend_after_ms=600_000)
    monkeypatch.setenv(SCHEMA_DIR_ENV, str(schema_dir(tmp_path, "newer")))
    _default_registry.cache_clear()
    try:  # the id in another spelling: the CLI normalises it
        data = as_json(run_cli("--json", "outbox", "show", "{" + rec.id.upper() + "}"))
    finally:
        monkeypatch.delenv(SCHEMA_DIR_ENV)
        _default_registry.cache_clear()
    assert data["envelope"]["payload_writer"] == writer.hex()
    assert data["payload"]["order_id"] == "order-77"
    assert data["payload"]["gift_wrap"] is False  # the newer reader's default
    assert "note" not in data["payload"]
    bad = run_cli("outbox", "show", "order-77")
    assert bad.exit_code == 2
    assert "is not a UUID" in bad.stderr
