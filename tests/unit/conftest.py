"""Codec fixtures shared by the unit tests: one registry of schemas/ per module."""

from __future__ import annotations

import pytest
from codec_samples import load_registry

from eoguard import EnvelopeCodec, PayloadCodec, SchemaRegistry


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return load_registry()


@pytest.fixture(scope="module")
def codec(registry: SchemaRegistry) -> EnvelopeCodec:
    return EnvelopeCodec(registry)


@pytest.fixture(scope="module")
def payloads(registry: SchemaRegistry) -> PayloadCodec:
    return PayloadCodec(registry)
