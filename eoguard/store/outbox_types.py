"""Value types of the outbox: a record's lifecycle, what is written, stored and claimed."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from eoguard.config import KeepUntil

__all__ = [
    "ClaimBatch",
    "ClaimedRecord",
    "OutboxRecord",
    "PublishResult",
    "PutResult",
    "RecordState",
    "StoredRecord",
]


class RecordState(enum.Enum):
    """Lifecycle of an outbox record; deletion is the end of both paths."""

    PENDING = "pending"
    PUBLISHED = "published"

    def can_become(self, other: RecordState) -> bool:
        """The transitions the scripts perform: pending -> published, nothing back."""
        return self is RecordState.PENDING and other is RecordState.PUBLISHED


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxRecord:
    """A Kafka record to keep until it is published or consumed."""

    id: str
    topic: str
    key: bytes | None
    value: bytes
    headers: Mapping[str, str] | None = None  # Kafka record headers, not the envelope's
    attempt: int = 1
    created_at_ms: int
    expires_at_ms: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredRecord:
    """An outbox record as Redis holds it (for recovery, the CLI and tests)."""

    id: str
    topic: str
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    state: RecordState
    owner: str
    attempt: int
    keep_until: KeepUntil
    created_at_ms: int
    expires_at_ms: int
    owned_at_ms: int
    next_resend_at_ms: int  # also its score in the index while pending
    published_at_ms: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimedRecord:
    """A record whose ownership this producer just took, to be resent with ``attempt``."""

    id: str
    topic: str
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    attempt: int
    expires_at_ms: int
    previous_owner: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PutResult:
    """Ids stored, already present (left untouched) and already expired (not stored)."""

    stored: list[str]
    existing: list[str]
    expired: list[str]


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishResult:
    """Records kept as published, deleted (keep_until=published), and not found."""

    kept: int
    deleted: int
    missing: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimBatch:
    """What one claim pass took, and what its scavenging removed."""

    records: list[ClaimedRecord]
    swept: int  # index entries whose record had expired or was acked
    expired: int  # pending records past expires_at, deleted instead of resent
    scanned: int  # candidates examined
