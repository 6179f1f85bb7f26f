"""Job options and the command line: checked at construction, Kafka source defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eoguard.codec import InputLimits
from eoguard.errors import ConfigError
from eoguard_spark import AvroFraming, DedupMode, JobOptions, PlainFormat, PlainOptions
from eoguard_spark.__main__ import options_from, parser


def options(**overrides: Any) -> JobOptions:
    values: dict[str, Any] = {"bootstrap": "k:9092", "topics": ("t",), "scope": "app",
                              "checkpoint": "/tmp/cp", "output_path": "/tmp/out"}
    values.update(overrides)
    return JobOptions(**values)


def test_invalid_options_are_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="scope"):
        options(scope="a|b")
    with pytest.raises(ConfigError, match="not both"):
        options(available_now=True, trigger_interval="5 seconds")
    with pytest.raises(ConfigError, match="subscribe"):
        options(kafka_options={"subscribe": "other"})
    with pytest.raises(ConfigError, match="topics"):
        options(topics="t")
    with pytest.raises(ConfigError, match="lease_s"):
        options(lease_s=0)
    with pytest.raises(ConfigError, match="differ"):
        options(dead_letter_path="/tmp/out")


def test_kafka_source_defaults_guard_against_loss_and_aborted_writes() -> None:
    source = options(topics=("a", "b"), max_offsets_per_trigger=7).source_options()
    assert source["subscribe"] == "a,b"
    assert source["failOnDataLoss"] == "true"
    assert source["kafka.isolation.level"] == "read_committed"
    assert source["maxOffsetsPerTrigger"] == "7"
    assert source["startingOffsets"] == "earliest"
    relaxed = options(kafka_options={"failOnDataLoss": "false"}).source_options()
    assert relaxed["failOnDataLoss"] == "false"


def test_secrets_stay_out_of_repr_and_logs() -> None:
    opts = options(redis_url="redis://:s3cret@host:6379/0",
                   kafka_options={"kafka.sasl.jaas.config": "password=s3cret"})
    assert "s3cret" not in repr(opts)
    assert "s3cret" not in str(opts.describe())


def test_command_line_maps_to_options() -> None:
    args = parser().parse_args([
        "--bootstrap", "k:9092", "--topic", "a", "--topic", "b", "--scope", "billing",
        "--checkpoint", "/c", "--output", "/o", "--dedup", "watermark", "--available-now",
        "--max-offsets-per-trigger", "100", "--kafka-option", "kafka.security.protocol=SSL",
        "--no-ack-outbox", "--idempotent-sink"])
    opts = options_from(args)
    assert opts.topics == ("a", "b")
    assert opts.dedup is DedupMode.WATERMARK
    assert opts.available_now
    assert opts.max_offsets_per_trigger == 100
    assert opts.kafka_options == {"kafka.security.protocol": "SSL"}
    assert not opts.ack_outbox
    assert opts.idempotent_sink


def test_command_line_endpoints_come_from_the_flags_then_the_environment_then_the_stack(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--topic", "a", "--scope", "s", "--checkpoint", "/c", "--output", "/o"]
    monkeypatch.setenv("EOGUARD_TOPOLOGY", "single")
    for name in ("EOGUARD_KAFKA_BOOTSTRAP", "EOGUARD_REDIS_URL", "EOGUARD_KAFKA_PORT",
                 "EOGUARD_REDIS_PORT"):
        monkeypatch.delenv(name, raising=False)
    stack = options_from(parser().parse_args(base))
    assert (stack.bootstrap, stack.redis_url) == ("127.0.0.1:19092", "redis://127.0.0.1:16379/0")
    assert stack.redis_url == JobOptions(bootstrap="k", topics=("t",), scope="s",
                                         checkpoint="/c").redis_url  # the library's default
    monkeypatch.setenv("EOGUARD_KAFKA_BOOTSTRAP", "env:9092")
    monkeypatch.setenv("EOGUARD_REDIS_URL", "redis://env:6379/1")
    env = options_from(parser().parse_args(base))
    assert (env.bootstrap, env.redis_url) == ("env:9092", "redis://env:6379/1")
    flags = options_from(parser().parse_args([*base, "--bootstrap", "f:9092",
                                              "--redis-url", "redis://f:6379/2"]))
    assert (flags.bootstrap, flags.redis_url) == ("f:9092", "redis://f:6379/2")
    bad = parser().parse_args(["--bootstrap", "k", "--topic", "a", "--scope", "s",
                               "--checkpoint", "/c", "--output", "/o", "--kafka-option", "oops"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        options_from(bad)


def test_the_input_limits_come_from_the_command_line_and_default_to_the_consumers() -> None:
    base = ["--bootstrap", "k:9092", "--topic", "t", "--scope", "app", "--checkpoint", "/cp",
            "--output", "/out"]
    assert options_from(parser().parse_args(base)).input_limits == InputLimits()
    limits = options_from(parser().parse_args([
        *base, "--max-payload-bytes", "2000", "--max-headers", "4", "--max-header-bytes", "200",
        "--max-producer-chars", "64", "--clock-skew-s", "3"])).input_limits
    assert limits == InputLimits(payload_bytes=2000, header_count=4, header_bytes=200,
                                 producer_chars=64, clock_skew_ms=3000)
    with pytest.raises(ConfigError, match="payload_bytes"):
        options_from(parser().parse_args([*base, "--max-payload-bytes", "-1"]))


def test_plain_options_are_checked_at_construction() -> None:
    def plain(**overrides: Any) -> PlainOptions:
        values: dict[str, Any] = {"format": "json", "id_namespace": "orders", "ttl_s": 600,
                                  "id_field": "order"}
        values.update(overrides)
        return PlainOptions(**values)

    assert plain().format is PlainFormat.JSON
    cases: list[tuple[dict[str, Any], str]] = [
        ({"format": "avro-json"}, "not one of"),
        ({"id_namespace": ""}, "id_namespace"),
        ({"ttl_s": 0}, "positive"),
        ({"ttl_s": True}, "positive"),
        ({"ttl_s": float("inf")}, "positive"),
        ({"id_header": "h"}, "exactly one"),
        ({"id_field": None}, "exactly one"),
        ({"id_field": "a.b"}, "letters, digits"),
        ({"format": "raw"}, "give id_header"),
        ({"format": "raw", "id_field": None, "id_header": "h", "json_schema": "a int"},
         "for format json"),
    ]
    for overrides, words in cases:
        with pytest.raises(ConfigError, match=words):
            plain(**overrides)
    with pytest.raises(ConfigError, match="exceeds max_ttl_ms"):
        options(plain=plain(ttl_s=7200), max_ttl_ms=3_600_000)
    with pytest.raises(ConfigError, match="payload_schema"):
        options(plain=plain(), payload_schema="eoguard.example.Order")
    with pytest.raises(ConfigError, match="PlainOptions"):
        options(plain={"format": "json"})
    by_header = options(plain=plain(format="raw", id_field=None, id_header="order-id"))
    assert by_header.source_options()["includeHeaders"] == "true"
    assert "includeHeaders" not in options(plain=plain()).source_options()


def test_the_command_line_builds_plain_options() -> None:
    base = ["--bootstrap", "k:9092", "--topic", "t", "--scope", "app", "--checkpoint", "/tmp/c",
            "--output", "/tmp/o"]
    args = parser().parse_args([*base, "--plain-format", "json", "--plain-id-namespace",
                                "orders", "--plain-id-field", "order", "--plain-ttl-s", "60"])
    assert options_from(args).plain == PlainOptions(format=PlainFormat.JSON, id_namespace="orders",
                                                    ttl_s=60.0, id_field="order")
    with pytest.raises(ConfigError, match="--plain-ttl-s"):
        options_from(parser().parse_args([*base, "--plain-format", "raw"]))


ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order", "type": "long"}, {"name": "ref", "type": ["null", "string"]},
    {"name": "total_cents", "type": "double"},
    {"name": "tx", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "java", "type": {"type": "string", "avro.java.string": "String"}},
    {"name": "both", "type": ["null", "string", "long"]}]}


def test_avro_plain_options_are_checked_at_construction() -> None:
    def plain(**overrides: Any) -> PlainOptions:
        values: dict[str, Any] = {"format": "avro", "id_namespace": "orders", "ttl_s": 600,
                                  "id_field": "order", "avro_schema": json.dumps(ORDER),
                                  "avro_framing": "registry"}
        values.update(overrides)
        return PlainOptions(**values)

    assert plain().avro_framing is AvroFraming.REGISTRY
    assert plain(avro_framing="none", id_field="ref").avro_framing is AvroFraming.NONE
    assert plain(id_field="java").id_field == "java"  # a type object without a logical type
    assert plain(id_field=None, id_header="order-id").id_header == "order-id"
    nameless = {**ORDER, "name": None}
    fields_of = {**ORDER, "fields": [*ORDER["fields"], {"name": "_eoguard_decoded",
                                                         "type": "int"}]}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"avro_schema": None}, "needs avro_schema"),
        ({"avro_framing": None}, "needs avro_framing"),
        ({"avro_framing": "confluent"}, "avro_framing 'confluent' is not one of"),
        ({"avro_schema": ""}, "must be the JSON of an Avro schema"),
        ({"avro_schema": "{not json"}, "not a valid Avro schema: JSONDecodeError"),
        ({"avro_schema": json.dumps(nameless)}, "not a valid Avro schema"),
        ({"avro_schema": json.dumps({**ORDER, "fields": [{"name": "x", "type": "nope"}]})},
         "not a valid Avro schema: UnknownType"),
        ({"avro_schema": '"string"'}, "must be an Avro record schema"),
        ({"avro_schema": json.dumps(fields_of)}, "has a field '_eoguard_decoded'"),
        ({"id_field": "missing"}, "'missing' is not a top-level field of avro_schema"),
        ({"id_field": "total_cents"}, "is \"double\": a key is a string, int or long"),
        ({"id_field": "both"}, "a key is a string, int or long"),
        ({"id_field": "tx"}, "has logicalType 'uuid'"),
        ({"format": "json"}, "avro_schema and avro_framing are for format avro"),
        ({"format": "json", "avro_schema": None}, "avro_schema and avro_framing are for"),
        ({"format": "raw", "id_field": None, "id_header": "h"}, "for format avro"),
        ({"format": "raw"}, "give id_header"),
        ({"json_schema": "order bigint"}, "for format json"),
    ]
    for overrides, words in cases:
        with pytest.raises(ConfigError, match=words):
            plain(**overrides)


def test_the_command_line_builds_avro_plain_options(tmp_path: Path) -> None:
    base = ["--bootstrap", "k:9092", "--topic", "t", "--scope", "app", "--checkpoint", "/tmp/c",
            "--output", "/tmp/o", "--plain-format", "avro", "--plain-id-namespace", "orders",
            "--plain-id-field", "order", "--plain-ttl-s", "60"]
    avsc = tmp_path / "order.avsc"
    avsc.write_text(json.dumps(ORDER))
    want = PlainOptions(format=PlainFormat.AVRO, id_namespace="orders", ttl_s=60.0,
                        id_field="order", avro_schema=json.dumps(ORDER),
                        avro_framing=AvroFraming.REGISTRY)
    for schema in (json.dumps(ORDER), f"@{avsc}"):
        args = parser().parse_args([*base, "--plain-avro-schema", schema,
                                    "--plain-avro-framing", "registry"])
        assert options_from(args).plain == want
    with pytest.raises(ConfigError, match="needs avro_framing"):
        options_from(parser().parse_args([*base, "--plain-avro-schema", f"@{avsc}"]))
    with pytest.raises(ConfigError, match="--plain-avro-schema '@/nonexistent"):
        options_from(parser().parse_args([*base, "--plain-avro-schema", "@/nonexistent.avsc",
                                          "--plain-avro-framing", "none"]))
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parser().parse_args([*base, "--plain-avro-framing", "confluent"])
