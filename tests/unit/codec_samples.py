"""Sample envelopes and orders shared by the codec tests (imported, not collected)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

from eoguard import Envelope, SchemaRegistry, new_message_id

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
ENVELOPE_V0 = ROOT / "tests" / "data" / "envelope_v0.avsc"
ORDER = "eoguard.example.Order"
UTC = dt.timezone.utc


def load_registry() -> SchemaRegistry:
    """The checkout's schemas plus the older envelope version of tests/data."""
    reg = SchemaRegistry.from_dir(SCHEMAS)
    reg.register(json.loads(ENVELOPE_V0.read_text()), current=False)
    return reg


def envelope(**overrides: Any) -> Envelope:
    fields: dict[str, Any] = {
        "id": new_message_id(), "expires_at_ms": 1_700_000_060_000,
        "created_at_ms": 1_700_000_000_000, "producer": "producer-1", "attempt": 1,
        "payload_schema": None, "payload": b"raw", "headers": {},
    }
    return Envelope(**(fields | overrides))


def order(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "order_id": "o-1001", "customer": "c-42", "amount": decimal.Decimal("1234.50"),
        "currency": "EUR",
        "items": [{"sku": "A-1", "qty": 2, "unit_price": 99.5},
                  {"sku": "B-7", "qty": 1, "unit_price": 1035.5}],
        "created_at": dt.datetime(2024, 5, 1, 12, 30, 15, 123_000, tzinfo=UTC),
        "express": True, "attributes": {"channel": "web", "campaign": "spring"},
        "note": "leave at the door",
    }
    return value | overrides
