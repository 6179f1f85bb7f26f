"""Schemas: fingerprints, the reference implementation both ways, evolution, the registry.

Cross-checked against the independent reference implementation (the ``avro`` package)
and the CRC-64-AVRO test vectors of the Avro specification's test suite.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import pytest
from codec_samples import (
    ENVELOPE_V0,
    ORDER,
    SCHEMAS,
    UTC,
    envelope,
    order,
)
from fastavro import schemaless_writer
from fastavro.schema import fingerprint as fastavro_fingerprint

from eoguard import (
    ConfigError,
    Envelope,
    EnvelopeCodec,
    PayloadCodec,
    SchemaRegistry,
    UnknownFingerprintError,
    new_message_id,
)
from eoguard.codec import HEADER_SIZE, MAGIC, fingerprint_of
from eoguard.codec.schemas import SCHEMA_DIR_ENV, crc64_avro, default_schema_dir

ROOT = SCHEMAS.parent


def without_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_logical_types(v) for k, v in node.items()
                if k not in {"logicalType", "precision", "scale"}}
    if isinstance(node, list):
        return [without_logical_types(v) for v in node]
    return node


def avro_schema(schema: dict[str, Any]) -> avro.schema.Schema:
    return avro.schema.parse(json.dumps(schema))


# --- fingerprints and the reference implementation ----------------------------------------

# From the Avro project's share/test/data/schema-tests.txt (CRC-64-AVRO as signed longs).
SPEC_VECTORS = {
    '"null"': 7195948357588979594,
    '"boolean"': -6970731678124411036,
    '"int"': 8247732601305521295,
    '"long"': -3434872931120570953,
    '"string"': -8142146995180207161,
    '"bytes"': 5746618253357095269,
}


@pytest.mark.parametrize(("text", "expected"), SPEC_VECTORS.items())
def test_crc64_avro_matches_the_specification_vectors(text: str, expected: int) -> None:
    assert crc64_avro(text) == (expected % 2**64).to_bytes(8, "little")


@pytest.mark.parametrize("name", ["eoguard.Envelope", ORDER])
def test_fingerprints_match_fastavro_and_the_avro_package(registry: SchemaRegistry,
                                                          name: str) -> None:
    entry = registry.get(name)
    # fastavro's own CRC-64-AVRO (hex of the little-endian bytes) over the canonical form.
    assert fastavro_fingerprint(entry.canonical_form, "CRC-64-AVRO") == entry.fingerprint.hex()
    # The reference implementation, over the Parsing Canonical Form.
    assert avro_schema(json.loads(entry.canonical_form)).fingerprint("CRC-64-AVRO") == \
        entry.fingerprint
    # Same CRC algorithm as the reference over the reference's own canonical text ...
    reference = avro_schema(entry.schema)
    assert crc64_avro(reference.canonical_form) == reference.fingerprint("CRC-64-AVRO")
    # ... whose canonical form differs only where avro 1.12 keeps {"type":"long"} for a
    # primitive with a logicalType (the spec asks for the simple form "long", as fastavro
    # and Java write it): both agree once logical types are out of the picture.
    assert fingerprint_of(entry.schema) == entry.fingerprint
    assert avro_schema(without_logical_types(entry.schema)).fingerprint("CRC-64-AVRO") == \
        entry.fingerprint


def test_the_plain_schema_has_the_same_fingerprint_as_the_full_one(registry: SchemaRegistry
                                                                   ) -> None:
    entry = registry.get("eoguard.Envelope")
    assert "logicalType" in json.dumps(entry.schema)
    assert "logicalType" not in json.dumps(entry.plain)
    assert fingerprint_of(entry.plain) == entry.fingerprint


def test_the_avro_package_reads_what_eoguard_wrote(codec: EnvelopeCodec,
                                                   registry: SchemaRegistry) -> None:
    env = envelope(payload_schema=ORDER, payload=b"\x01\x02", headers={"h": "v", "x": ""},
                   payload_fingerprint=b"\x00\x01\x02\x03\x04\x05\x06\xff")
    value = codec.encode(env)
    reader = avro.io.DatumReader(avro_schema(registry.get("eoguard.Envelope").schema))
    body = io.BytesIO(value[HEADER_SIZE:])
    record: Any = reader.read(avro.io.BinaryDecoder(body))
    assert body.tell() == len(value) - HEADER_SIZE
    epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
    millis = {k: (record[k] - epoch) // dt.timedelta(milliseconds=1)
              for k in ("expires_at", "created_at")}
    assert record | millis == {
        "id": env.id, "expires_at": env.expires_at_ms, "created_at": env.created_at_ms,
        "producer": env.producer, "attempt": env.attempt, "payload_schema": ORDER,
        "payload": b"\x01\x02", "headers": {"h": "v", "x": ""},
        "payload_fingerprint": b"\x00\x01\x02\x03\x04\x05\x06\xff",
    }


def test_eoguard_reads_what_the_avro_package_wrote(codec: EnvelopeCodec,
                                                   registry: SchemaRegistry) -> None:
    schema = avro_schema(registry.get("eoguard.Envelope").schema)
    message_id = new_message_id()
    record = {
        "id": message_id,
        "expires_at": dt.datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
        "created_at": dt.datetime(2030, 1, 2, 3, 4, 0, tzinfo=UTC),
        "producer": "avro-ref", "attempt": 7, "payload_schema": None, "payload": b"\xff",
        "headers": {"k": "v"},
    }
    body = io.BytesIO()
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(body))
    decoded = codec.decode(MAGIC + codec.fingerprint + body.getvalue())
    assert decoded == Envelope(
        id=message_id, expires_at_ms=1_893_553_445_678, created_at_ms=1_893_553_440_000,
        producer="avro-ref", attempt=7, payload_schema=None, payload=b"\xff",
        headers={"k": "v"},
    )


def test_order_payload_is_readable_by_the_avro_package_and_back(registry: SchemaRegistry,
                                                                payloads: PayloadCodec) -> None:
    schema = avro_schema(registry.get(ORDER).schema)
    data = payloads.encode(order(), ORDER)
    assert avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(data))) == order()
    body = io.BytesIO()
    avro.io.DatumWriter(schema).write(order(note=None), avro.io.BinaryEncoder(body))
    assert payloads.decode(body.getvalue(), ORDER) == order(note=None)


# --- schema evolution ----------------------------------------------------------------------


def v0_value(registry: SchemaRegistry, record: dict[str, Any]) -> bytes:
    v0 = registry.by_fingerprint(fingerprint_of(json.loads(ENVELOPE_V0.read_text())))
    body = io.BytesIO()
    schemaless_writer(body, v0.plain, record)
    return MAGIC + v0.fingerprint + body.getvalue()


def test_an_envelope_of_version_2_is_read_with_no_payload_fingerprint(
        codec: EnvelopeCodec, registry: SchemaRegistry) -> None:
    v2 = registry.by_fingerprint(fingerprint_of(
        json.loads((SCHEMAS / "history" / "envelope_v2.avsc").read_text())))
    assert v2.fingerprint != codec.fingerprint
    message_id = new_message_id()
    body = io.BytesIO()
    schemaless_writer(body, v2.plain, {
        "id": message_id, "expires_at": 20, "created_at": 10, "producer": "v2", "attempt": 1,
        "payload_schema": ORDER, "payload": b"p", "headers": {"k": "v"}})
    assert codec.decode(MAGIC + v2.fingerprint + body.getvalue()) == Envelope(
        id=message_id, expires_at_ms=20, created_at_ms=10, producer="v2", attempt=1,
        payload_schema=ORDER, payload=b"p", headers={"k": "v"}, payload_fingerprint=None)


def test_an_envelope_written_by_the_older_schema_is_read_by_the_current_one(
        codec: EnvelopeCodec, registry: SchemaRegistry) -> None:
    assert len(registry.versions("eoguard.Envelope")) == 3  # current, history/v2, test v0
    message_id = new_message_id()
    value = v0_value(registry, {
        "id": message_id, "expires_at": 20, "created_at": 10, "producer": "old",
        "attempt": 2, "payload_schema": ORDER, "payload": b"p",
    })
    assert value[2:HEADER_SIZE] != codec.fingerprint
    for _ in range(2):  # the second decode uses the cached resolution
        assert codec.decode(value) == Envelope(
            id=message_id, expires_at_ms=20, created_at_ms=10, producer="old", attempt=2,
            payload_schema=ORDER, payload=b"p", headers={},
        )


def test_a_codec_without_the_older_schema_reports_its_fingerprint(registry: SchemaRegistry
                                                                  ) -> None:
    value = v0_value(registry, {"id": new_message_id(), "expires_at": 2, "created_at": 1,
                                "producer": "old", "attempt": 1, "payload_schema": None,
                                "payload": b""})
    with pytest.raises(UnknownFingerprintError) as info:
        EnvelopeCodec(SchemaRegistry.from_dir(SCHEMAS)).decode(value)
    assert info.value.fingerprint == value[2:HEADER_SIZE]


def test_history_directory_holds_older_versions(tmp_path: Path) -> None:
    shutil.copytree(SCHEMAS, tmp_path / "schemas")
    shutil.copy(ENVELOPE_V0, tmp_path / "schemas" / "history" / "envelope_v0.avsc")
    reg = SchemaRegistry.from_dir(tmp_path / "schemas")
    assert reg.get("eoguard.Envelope").fingerprint == fingerprint_of(
        json.loads((SCHEMAS / "envelope.avsc").read_text()))
    assert len(reg.versions("eoguard.Envelope")) == 3


def test_two_current_versions_of_one_name_are_refused(tmp_path: Path) -> None:
    shutil.copytree(SCHEMAS, tmp_path / "schemas")
    shutil.copy(ENVELOPE_V0, tmp_path / "schemas" / "envelope_v0.avsc")
    with pytest.raises(ConfigError, match=r"two current schemas named eoguard\.Envelope"):
        SchemaRegistry.from_dir(tmp_path / "schemas")


# --- the registry ---------------------------------------------------------------------------


def test_registry_loads_every_schema_and_looks_up_by_name_and_fingerprint(
        registry: SchemaRegistry) -> None:
    assert {"eoguard.Envelope", ORDER} <= set(registry.names())
    assert ORDER in registry
    assert "no.Such" not in registry
    entry = registry.get(ORDER)
    assert registry.by_fingerprint(entry.fingerprint) is entry
    assert entry.source == SCHEMAS / "order.avsc"


def test_default_registry_is_cached_and_comes_from_the_checkout(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.delenv(SCHEMA_DIR_ENV, raising=False)
    assert SchemaRegistry.default() is SchemaRegistry.default()
    assert default_schema_dir() == SCHEMAS
    monkeypatch.setenv(SCHEMA_DIR_ENV, "/somewhere/else")
    assert default_schema_dir() == Path("/somewhere/else")


def test_registry_reports_bad_directories_and_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SchemaRegistry.from_dir(tmp_path / "missing")
    (tmp_path / "broken.avsc").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        SchemaRegistry.from_dir(tmp_path)
    (tmp_path / "broken.avsc").write_text('{"type": "record", "name": "X", "fields": 3}')
    with pytest.raises(ConfigError, match="invalid Avro schema"):
        SchemaRegistry.from_dir(tmp_path)
    (tmp_path / "broken.avsc").write_text('{"type": "string"}')
    with pytest.raises(ConfigError, match="not a named type"):
        SchemaRegistry.from_dir(tmp_path)


def test_an_installed_package_finds_its_bundled_schemas(tmp_path: Path) -> None:
    # The wheel force-includes schemas/ as eoguard/_schemas (pyproject.toml); outside a
    # checkout the registry must load that copy.
    site = tmp_path / "site"
    shutil.copytree(ROOT / "eoguard", site / "eoguard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SCHEMAS, site / "eoguard" / "_schemas")
    env = {k: v for k, v in os.environ.items() if k != SCHEMA_DIR_ENV}
    env["PYTHONPATH"] = str(site)
    script = ("from eoguard.codec import SchemaRegistry\n"
              "from eoguard.codec.schemas import default_schema_dir\n"
              "print(default_schema_dir()); print(*SchemaRegistry.default().names())")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    where, names = done.stdout.splitlines()
    assert Path(where) == site / "eoguard" / "_schemas"
    assert names.split() == SchemaRegistry.from_dir(SCHEMAS).names()
