"""The hand-written envelope writer writes what fastavro writes, byte for byte."""

from __future__ import annotations

import dataclasses
import io
import random

import pytest
from fastavro import schemaless_writer

from eoguard import CodecError, Envelope, SchemaRegistry
from eoguard.codec import EnvelopeCodec, envelope_writer
from eoguard.envelope import new_message_id


def fastavro_value(registry: SchemaRegistry, env: Envelope) -> bytes:
    current = registry.get("eoguard.Envelope")
    out = io.BytesIO()
    out.write(b"\xc3\x01" + current.fingerprint)
    schemaless_writer(out, current.plain, {
        "id": env.id, "expires_at": env.expires_at_ms, "created_at": env.created_at_ms,
        "producer": env.producer, "attempt": env.attempt, "payload_schema": env.payload_schema,
        "payload": env.payload, "headers": env.headers,
        "payload_fingerprint": env.payload_fingerprint})
    return out.getvalue()


def test_it_writes_the_current_envelope_schema(registry: SchemaRegistry) -> None:
    assert registry.get("eoguard.Envelope").fingerprint == envelope_writer.WRITES


def random_text(rng: random.Random, most: int) -> str:
    alphabet = "abcXYZ-09 ü€𝄞\u0000\n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))


def random_envelope(rng: random.Random) -> Envelope:
    long_value = rng.choice([0, 1, -1, 63, 64, -64, -65, 1_700_000_000_000, 2**35, 2**42,
                             2**62, -(2**63), 2**63 - 1, rng.randint(-(2**63), 2**63 - 1)])
    return Envelope(
        id=rng.choice([new_message_id(), random_text(rng, 60)]),
        expires_at_ms=long_value,
        created_at_ms=rng.choice([1_700_000_000_000 + rng.randint(0, 10**9), long_value]),
        producer=random_text(rng, 300),
        attempt=rng.choice([1, 2, 0, -1, 2**31 - 1, -(2**31)]),
        payload_schema=rng.choice([None, "eoguard.example.Order", random_text(rng, 200)]),
        payload=rng.randbytes(rng.choice([0, 1, 63, 64, 200, 70_000])),
        headers={random_text(rng, 20): random_text(rng, 200) for _ in range(rng.randint(0, 70))},
        payload_fingerprint=rng.choice([None, rng.randbytes(8)]))


def test_byte_for_byte_against_fastavro(registry: SchemaRegistry) -> None:
    rng = random.Random(20261126)
    codec = EnvelopeCodec(registry)
    for _ in range(800):
        env = random_envelope(rng)
        value = codec.encode(env)
        assert value == fastavro_value(registry, env), env
        assert codec.decode(value) == env


@pytest.mark.parametrize("fields", [
    {"expires_at_ms": 2**63}, {"created_at_ms": -(2**63) - 1}, {"attempt": 2**31},
    {"payload_fingerprint": b"\x01" * 7}, {"id": "\ud800"},
])
def test_values_avro_cannot_hold_are_codec_errors(registry: SchemaRegistry,
                                                  fields: dict[str, object]) -> None:
    env = dataclasses.replace(Envelope.create(b"p", ttl_ms=1, producer="p"), **fields)  # type: ignore[arg-type]
    with pytest.raises(CodecError, match=r"does not fit eoguard\.Envelope"):
        EnvelopeCodec(registry).encode(env)
