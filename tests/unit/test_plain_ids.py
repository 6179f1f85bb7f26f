"""The consumer's plain-record id rules (id_from_field, id_from_header, business_key) give the
ids of tests/plain_vectors.py, which the Spark job's Columns must give too."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader

from eoguard import InputLimits, InvalidRecordError, Lifetime, PlainRecords
from eoguard.codec.plain import business_key, id_from_field, id_from_header, read_plain
from tests.plain_vectors import (
    AVRO_BODIES,
    AVRO_CONSUMER_ONLY,
    AVRO_REFUSED,
    HEADER_KEYS,
    INT_KEYS,
    NAMESPACE,
    TEXT_KEYS,
    avro_order_schema,
)

NOW = 1_800_000_000_000


def read(rules: PlainRecords, value: bytes, headers: dict[str, bytes] | None = None) -> str:
    envelope, _ = read_plain(rules, value, key=None, headers=headers, timestamp_ms=NOW,
                             topic="t", partition=0, offset=0, now_ms=NOW,
                             max_ttl_ms=86_400_000, limits=InputLimits())
    return envelope.id


def by_field(field: str) -> PlainRecords:
    return PlainRecords(deserializer=json.loads, id_rule=id_from_field(NAMESPACE, field),
                        lifetime=Lifetime(ttl_s=60))


@pytest.mark.parametrize(("key", "want"), [*TEXT_KEYS.items(), *INT_KEYS.items()])
def test_an_id_from_a_field_is_the_vectors(key: Any, want: str) -> None:
    assert read(by_field("order_id"), json.dumps({"order_id": key}).encode()) == want


@pytest.mark.parametrize(("key", "want"), list(HEADER_KEYS.items()))
def test_an_id_from_a_header_is_the_vectors(key: bytes, want: str) -> None:
    rules = PlainRecords(deserializer=bytes, id_rule=id_from_header(NAMESPACE, "order-id"),
                         lifetime=Lifetime(ttl_s=60))
    assert read(rules, b"anything", {"other": b"x", "order-id": key}) == want


def test_a_number_and_its_digits_are_one_key_and_other_values_are_no_key() -> None:
    assert business_key(42) == business_key("42") == "42"
    for value in (1.5, True, None, {"a": 1}, [1]):
        with pytest.raises(TypeError):
            business_key(value)
    with pytest.raises(InvalidRecordError, match="id rule raised TypeError"):
        read(by_field("order_id"), b'{"order_id": 4.0}')
    with pytest.raises(InvalidRecordError, match="id rule raised KeyError"):
        read(by_field("order_id"), b'{"order": 4}')


def avro_reader(id_type: str) -> PlainRecords:
    """A consumer's rules for Avro bodies of the vectors' schema: fastavro, no framing."""
    schema = parse_schema(avro_order_schema(id_type))
    return PlainRecords(deserializer=lambda raw: schemaless_reader(io.BytesIO(raw), schema),
                        id_rule=id_from_field(NAMESPACE, "order_id"), lifetime=Lifetime(ttl_s=60))


@pytest.mark.parametrize(("case", "want"), [*AVRO_BODIES.items(), *AVRO_CONSUMER_ONLY.items()])
def test_an_id_from_an_avro_field_is_the_vectors(case: tuple[str, str], want: str) -> None:
    id_type, body = case
    assert read(avro_reader(id_type), bytes.fromhex(body)) == want


@pytest.mark.parametrize("case", list(AVRO_REFUSED))
def test_the_avro_bodies_the_job_refuses_the_consumer_refuses(case: tuple[str, str]) -> None:
    id_type, body = case
    with pytest.raises(InvalidRecordError):
        read(avro_reader(id_type), bytes.fromhex(body))
