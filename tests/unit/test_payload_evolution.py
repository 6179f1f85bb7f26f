"""Payload schema evolution: a payload names its writer version, read into the current one."""

from __future__ import annotations

from pathlib import Path

import pytest

from eoguard import (
    EnvelopeCodec,
    PayloadCodec,
    SchemaRegistry,
    UnknownFingerprintError,
)
from eoguard.codec import fingerprint_of
from tests.schema_versions import ORDER, order_schema, schema_dir
from tests.unit.codec_samples import envelope, order


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SchemaRegistry]:
    root = tmp_path_factory.mktemp("versions")
    return {v: SchemaRegistry.from_dir(schema_dir(root, v)) for v in ("older", "newer")}


def written_by(version: str, registries: dict[str, SchemaRegistry]) -> tuple[bytes, bytes]:
    """An order encoded by a producer on ``version``: (payload, writer fingerprint)."""
    codec = PayloadCodec(registries[version])
    value = order() if version == "older" else {
        k: v for k, v in (order() | {"gift_wrap": True}).items() if k != "note"}
    fp = codec.writer_fingerprint(ORDER)
    assert fp == fingerprint_of(order_schema(version))  # type: ignore[arg-type]
    return codec.encode(value, ORDER), fp  # type: ignore[return-value]


@pytest.mark.parametrize(("writer", "reader", "expected"), [
    ("older", "older", order()),
    ("newer", "newer", {k: v for k, v in order(gift_wrap=True).items() if k != "note"}),
    # A field added with a default: an older payload gets it; a removed field is dropped.
    ("older", "newer", {k: v for k, v in order(gift_wrap=False).items() if k != "note"}),
    # The newer payload has no note (the older reader's default) and an unknown gift_wrap.
    ("newer", "older", order(note=None)),
])
def test_a_payload_is_read_into_the_readers_version(dirs: dict[str, SchemaRegistry],
                                                    writer: str, reader: str,
                                                    expected: dict[str, object]) -> None:
    payload, fp = written_by(writer, dirs)
    codec = PayloadCodec(dirs[reader])
    for _ in range(2):  # the second read uses the cached resolution
        assert codec.decode(payload, ORDER, fp) == expected
    env = envelope(payload_schema=ORDER, payload=payload, payload_fingerprint=fp)
    # The fingerprint travels in the envelope (version 3) and is honoured from there.
    decoded = EnvelopeCodec(dirs[reader]).decode(EnvelopeCodec(dirs[writer]).encode(env))
    assert decoded.payload_fingerprint == fp
    assert codec.decode_envelope(decoded) == expected


def test_an_unknown_writer_version_is_named(dirs: dict[str, SchemaRegistry]) -> None:
    payload, fp = written_by("newer", dirs)
    alone = SchemaRegistry.from_dir(Path(__file__).resolve().parents[2] / "schemas")
    with pytest.raises(UnknownFingerprintError, match=f"payload writer schema {fp.hex()}"):
        PayloadCodec(alone).decode(payload, ORDER, fp)


def test_a_writer_fingerprint_of_another_schema_is_refused(dirs: dict[str, SchemaRegistry]
                                                           ) -> None:
    envelope_fp = dirs["older"].get("eoguard.Envelope").fingerprint
    with pytest.raises(UnknownFingerprintError, match=r"is schema eoguard\.Envelope"):
        PayloadCodec(dirs["older"]).decode(b"", ORDER, envelope_fp)


def test_without_a_writer_fingerprint_the_current_version_reads(dirs: dict[str, SchemaRegistry]
                                                                ) -> None:
    payload, _ = written_by("older", dirs)
    assert PayloadCodec(dirs["older"]).decode(payload, ORDER, None) == order()
