"""``eoguard browse``: a topic's records with their dedup state per scope, envelopes and
Schema-Registry-framed values decoded, bad records shown; kcat's -o/-c/-p, -F and -X."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from eoguard import SchemaRegistryConfig, WireFormat
from eoguard.cli import render
from eoguard.codec.headers import ID, write_headers
from eoguard.envelope import now_ms
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.dedup import ClaimResult, DedupStore, DoneResult, position
from eoguard.store.keys import KeySpace
from tests.cli.conftest import ORDER, an_order, outbox_record
from tests.integration.test_producer import make_config

pytestmark = pytest.mark.integration

PING = {"type": "record", "name": "Ping", "namespace": "eoguard.test",
        "fields": [{"name": "n", "type": "int"}, {"name": "note", "type": "string"}]}
UNKNOWN_ID_VALUE = b"\x00\x7f\xff\xff\xf0" + b"\x02\x00"  # framed, an id no registry holds


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0,
             headers: list[tuple[str, bytes]] | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def _browse(run_cli, as_json, topic: str, bootstrap: str, *args: str) -> list[dict]:
    data = as_json(run_cli("--json", "browse", topic, "-b", bootstrap, *args))
    assert data["topic"] == topic
    return data["records"]


def test_envelopes_with_their_dedup_state_per_scope(run_cli, as_json, kafka_bootstrap, new_topic,
                                                     redis_client, key_prefix) -> None:
    topic = new_topic(partitions=1)
    records = [outbox_record(topic, n=i) for i in range(3)]
    _produce(kafka_bootstrap, topic, [r.value for r in records])
    keys = KeySpace(prefix=key_prefix)
    # billing: the first done, the second claimed under a live lease, the third never seen;
    # shipping: the third claimed under a lease that lapsed.
    billing = DedupStore(redis_client, scope="billing", keys=keys, lease_ms=60_000)
    claims = [billing.new_claim(r.id, position("billing-app", topic, 0, i), r.expires_at_ms)
              for i, r in enumerate(records)]
    assert [o.result for o in billing.claim("pass-1", claims[:1])] == [ClaimResult.NEW]
    assert [o.result for o in billing.done("pass-1", claims[:1])] == [DoneResult.OK]
    assert [o.result for o in billing.claim("pass-2", claims[1:2])] == [ClaimResult.NEW]
    shipping = DedupStore(redis_client, scope="shipping", keys=keys, lease_ms=1)
    lapsed = shipping.new_claim(records[2].id, position("shipping-app", topic, 0, 2),
                                records[2].expires_at_ms)
    assert [o.result for o in shipping.claim("pass-3", [lapsed])] == [ClaimResult.NEW]
    time.sleep(0.01)  # the 1 ms lease lapses

    rows = _browse(run_cli, as_json, topic, kafka_bootstrap, "-s", "billing", "-s", "shipping")
    assert [(r["partition"], r["offset"], r["format"], r["id"]) for r in rows] == [
        (0, i, "envelope", records[i].id) for i in range(3)]
    assert [r["dedup"] for r in rows] == [
        {"billing": "done", "shipping": "new"},
        {"billing": "in-progress", "shipping": "new"},
        {"billing": "new", "shipping": "free"},
    ]
    assert [r["payload"]["order_id"] for r in rows] == ["order-0", "order-1", "order-2"]
    assert all(r["expired"] is False and r["error"] is None for r in rows)
    assert rows[0]["schema"] == "eoguard.example.Order"

    table = run_cli("browse", topic, "-b", kafka_bootstrap, "-s", "billing")
    assert table.exit_code == 0, table.output
    assert records[0].id in table.stdout
    assert "in-progress" in table.stdout


def test_registry_framed_values_decoded_and_bad_records_shown(
        run_cli, as_json, kafka_bootstrap, new_topic, schema_registry_url,
        schema_registry_client) -> None:
    topic = new_topic(partitions=1)
    serialize = AvroSerializer(schema_registry_client, json.dumps(PING))
    context = SerializationContext(topic, MessageField.VALUE)
    envelope = outbox_record(topic).value
    _produce(kafka_bootstrap, topic, [
        serialize({"n": 1, "note": "[red]not markup[/red]"}, context),
        b"not a known format",
        UNKNOWN_ID_VALUE,
        envelope[:-3],  # an envelope cut short
        serialize({"n": 2, "note": "after the bad ones"}, context),
        envelope,
    ])
    rows = _browse(run_cli, as_json, topic, kafka_bootstrap,
                   "--schema-registry-url", schema_registry_url)
    assert [r["format"] for r in rows] == ["registry", "bad", "bad", "bad", "registry", "envelope"]
    assert rows[0]["payload"] == {"n": 1, "note": "[red]not markup[/red]"}
    assert rows[0]["schema"] == "eoguard.test.Ping"
    assert rows[4]["payload"] == {"n": 2, "note": "after the bad ones"}
    assert "neither an eoguard envelope" in rows[1]["error"]
    assert "schema id 2147483632 is not in Schema Registry" in rows[2]["error"]
    assert rows[3]["error"].startswith("envelope:")

    table = run_cli("browse", topic, "-b", kafka_bootstrap, "--schema-registry-url",
                    schema_registry_url)
    assert table.exit_code == 0, table.output
    assert "[red]not markup[/red]" in table.stdout  # shown as written, not styled
    assert "[bad]" in table.stdout


def test_header_format_records_show_their_id_expiry_and_payload(
        run_cli, as_json, kafka_bootstrap, redis_url, key_prefix, new_topic,
        schema_registry_url) -> None:
    topic = new_topic(partitions=1)
    config = make_config(kafka_bootstrap, redis_url, key_prefix, wire_format=WireFormat.HEADERS,
                         schema_registry=SchemaRegistryConfig(url=schema_registry_url))
    with GuardedProducer(config) as producer:
        avro = producer.send(topic, an_order(1), schema=ORDER)
        raw = producer.send(topic, b"raw bytes")
        assert producer.flush(30) == 0
    created = now_ms()
    broken = [(k, v.encode()) for k, v in write_headers(
        "not-used", created, created + 60_000, attempt=1, producer="p", source="/t",
        schema=None, app=None).items() if k != ID]
    _produce(kafka_bootstrap, topic, [b"x"], headers=broken)

    rows = _browse(run_cli, as_json, topic, kafka_bootstrap, "-s", "billing",
                   "--schema-registry-url", schema_registry_url)
    assert [(r["format"], r["id"]) for r in rows[:2]] == [("headers", avro.id), ("headers", raw.id)]
    assert rows[0]["payload"]["order_id"] == "order-1"
    assert rows[0]["schema"] == ORDER
    assert rows[0]["expires_at"] == render.iso_ms(avro.expires_at_ms)
    assert rows[1]["payload"] == "raw bytes"
    assert [r["dedup"] for r in rows[:2]] == [{"billing": "new"}] * 2
    assert rows[2]["format"] == "bad"
    assert f"missing header {ID}" in rows[2]["error"]


def test_offset_count_and_partition_as_kcat_takes_them(run_cli, as_json, kafka_bootstrap,
                                                       new_topic) -> None:
    topic = new_topic(partitions=2)
    values = [outbox_record(topic, n=i).value for i in range(4)]
    _produce(kafka_bootstrap, topic, values[:3], partition=0)
    _produce(kafka_bootstrap, topic, values[3:], partition=1)

    def seen(*args: str) -> list[tuple[int, int]]:
        return [(r["partition"], r["offset"])
                for r in _browse(run_cli, as_json, topic, kafka_bootstrap, *args)]

    assert seen() == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert seen("-o", "-1") == [(0, 2), (1, 0)]
    assert seen("-o", "1", "-p", "0") == [(0, 1), (0, 2)]
    assert seen("-c", "2") == [(0, 0), (0, 1)]
    assert seen("-o", "end") == []
    bad = run_cli("browse", topic, "-b", kafka_bootstrap, "-o", "middle")
    assert bad.exit_code == 2
    assert "offset 'middle'" in bad.output
    missing = run_cli("browse", topic, "-b", kafka_bootstrap, "-p", "7")
    assert missing.exit_code == 1
    assert "has no partition 7" in missing.output


def test_client_config_file_and_x_settings_reach_the_client(run_cli, as_json, kafka_bootstrap,
                                                            new_topic, tmp_path: Path) -> None:
    topic = new_topic(partitions=1)
    _produce(kafka_bootstrap, topic, [outbox_record(topic).value])
    nowhere = "127.0.0.1:1"  # nothing listens there: only the later settings can succeed
    config = tmp_path / "client.properties"
    config.write_text(f"# kcat's format\n\nbootstrap.servers = {kafka_bootstrap}\n"
                      "client.id=from-the-file\nsasl.password=file-secret-7\n")

    data = as_json(run_cli("--json", "browse", topic, "-b", nowhere, "-F", str(config),
                           "-X", "client.id=from-x"))
    assert [r["offset"] for r in data["records"]] == [0]
    assert data["client"]["client.id"] == "from-x"  # -X wins over -F
    assert data["client"]["sasl.password"] == "***"

    data = as_json(run_cli("--json", "browse", topic, "-b", nowhere,
                           "-X", f"bootstrap.servers={kafka_bootstrap}"))
    assert [r["offset"] for r in data["records"]] == [0]

    unknown = run_cli("browse", topic, "-b", kafka_bootstrap, "-X", "no.such.setting=1")
    assert unknown.exit_code == 2
    assert 'No such configuration property: "no.such.setting"' in unknown.output

    # librdkafka quotes a value it refuses; a secret's value never reaches the output.
    refused = run_cli("browse", topic, "-b", kafka_bootstrap, "-X", "sasl.password=x-secret-9",
                      "-X", "security.protocol=x-secret-9")
    assert refused.exit_code == 2
    assert "security.protocol" in refused.output
    assert "x-secret-9" not in refused.output

    config.write_text("client.id=ok\nsasl.password hunter2\n")
    malformed = run_cli("browse", topic, "-b", kafka_bootstrap, "-F", str(config))
    assert malformed.exit_code == 2
    assert "line 2" in malformed.output
    assert "hunter2" not in malformed.output


def test_outbox_resend_takes_the_client_options(run_cli, seeded, kafka_bootstrap,
                                                tmp_path: Path) -> None:
    unknown = run_cli("outbox", "resend", seeded.stuck[0], "--yes", "-b", kafka_bootstrap,
                      "-X", "no.such.setting=1")
    assert unknown.exit_code == 2
    assert 'No such configuration property: "no.such.setting"' in unknown.output
    config = tmp_path / "client.properties"
    config.write_text(f"bootstrap.servers={kafka_bootstrap}\n")
    result = run_cli("--json", "outbox", "resend", seeded.stuck[0], "--yes", "-b", "127.0.0.1:1",
                     "-F", str(config))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resent"] == 1
