"""Value types of the outbox: a record's lifecycle, what is written, stored and claimed, and
the layout of a record's value in Redis.

A record is one Redis string (``SET NX`` with ``PXAT`` = its ``expires_at``, at most Redis's
now + ``max_ttl``)::

    <state>:<owned_at>:<next_resend_at>:<len(owner)>:<owner>    written by the scripts
    <attempt>:<keep>:<created_at>:<expires_at>:<len(topic)>:<len(key)>:<len(headers)>:
    <topic><key><headers JSON><value>                   the body (built by :func:`record_body`)

``state`` is one byte at offset 0, ``0`` pending or ``1`` published (set in place by
``SETRANGE``); ``len(key)`` is -1 for a record without a key; ``headers`` are the Kafka record
headers as JSON (empty for none). The id is not stored: the key name ends with it. One string
costs one command to write with its TTL and existence check (``SET NX PXAT``), where a hash
took three.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from eoguard.modes import KeepUntil

__all__ = [
    "ClaimBatch",
    "ClaimedRecord",
    "OutboxEntry",
    "OutboxRecord",
    "PublishResult",
    "PutResult",
    "RecordFields",
    "RecordState",
    "StoredRecord",
    "parse_record",
    "record_body",
]


class RecordState(enum.Enum):
    """Lifecycle of an outbox record; deletion is the end of both paths."""

    PENDING = "pending"
    PUBLISHED = "published"

    def can_become(self, other: RecordState) -> bool:
        """The transitions the scripts perform: pending -> published, nothing back."""
        return self is RecordState.PENDING and other is RecordState.PUBLISHED


class OutboxEntry(Protocol):
    """What :meth:`Outbox.put` reads of each message (an :class:`OutboxRecord`, or the
    producer's in-memory message, which carries the same attributes)."""

    @property
    def id(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, str] | None: ...
    @property
    def headers_json(self) -> bytes | None:
        """``headers`` as the record stores them (``json.dumps``, UTF-8), when the maker of
        the entry has them at less cost; None: :func:`record_body` dumps them."""
    @property
    def attempt(self) -> int: ...
    @property
    def created_at_ms(self) -> int: ...
    @property
    def expires_at_ms(self) -> int: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxRecord:
    """A Kafka record to keep until it is published or consumed."""

    id: str
    topic: str
    key: bytes | None
    value: bytes
    headers: Mapping[str, str] | None = None  # Kafka record headers, not the envelope's
    headers_json: bytes | None = None  # OutboxEntry.headers_json
    attempt: int = 1
    created_at_ms: int
    expires_at_ms: int


def record_body(entry: OutboxEntry, keep: bytes) -> bytes:
    """The body of ``entry``'s record (see the module docstring); ``keep`` is the
    :class:`KeepUntil` value, encoded."""
    topic = entry.topic.encode()
    key = entry.key
    headers = entry.headers_json
    if headers is None:
        headers = json.dumps(dict(entry.headers)).encode() if entry.headers else b""
    return b"%d:%s:%d:%d:%d:%d:%d:%s%s%s%s" % (
        entry.attempt, keep, entry.created_at_ms, entry.expires_at_ms, len(topic),
        -1 if key is None else len(key), len(headers), topic, key or b"", headers, entry.value)


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordFields:
    """A record's value, parsed (by :func:`parse_record`)."""

    state: RecordState
    owned_at_ms: int
    next_resend_at_ms: int
    owner: str
    attempt: int
    keep_until: KeepUntil
    created_at_ms: int
    expires_at_ms: int
    topic: str
    key: bytes | None
    headers: dict[str, str]
    value: bytes


def parse_record(raw: bytes, *, partial: bool = False) -> RecordFields:
    """Parse a record's value. With ``partial``, ``raw`` may be a prefix of it (``GETRANGE``)
    that reaches past the topic: ``key``, ``headers`` and ``value`` may then be cut short.
    Raises ValueError when ``raw`` is malformed or shorter than that."""
    state, owned_at, next_resend_at, owner_len, rest = raw.split(b":", 4)
    n = int(owner_len)
    owner, body = rest[:n], rest[n:]
    attempt, keep, created, expires, topic_len, key_len, headers_len, data = body.split(b":", 7)
    t, k, h = int(topic_len), int(key_len), int(headers_len)
    if len(data) < (t if partial else t + max(k, 0) + h):
        raise ValueError("outbox record cut short")
    key = None if k < 0 else data[t:t + k]
    k = max(k, 0)
    headers = data[t + k:t + k + h]
    return RecordFields(
        state=RecordState.PUBLISHED if state == b"1" else RecordState.PENDING,
        owned_at_ms=int(owned_at), next_resend_at_ms=int(next_resend_at),
        owner=owner.decode(), attempt=int(attempt),
        keep_until=KeepUntil(keep.decode()), created_at_ms=int(created),
        expires_at_ms=int(expires), topic=data[:t].decode(), key=key,
        headers=dict(json.loads(headers)) if h and len(headers) == h else {},
        value=data[t + k + h:])


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


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimedRecord:
    """A record whose ownership this producer just took, to be resent with ``attempt``."""

    id: str
    topic: str
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    attempt: int
    keep_until: KeepUntil  # the record's own: its publish mark deletes it or keeps it
    expires_at_ms: int
    previous_owner: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PutResult:
    """Ids stored, already present (left untouched) and already expired (not stored);
    ``existing_entries`` are the very entries found present (two entries of one id in one
    write: the first is stored, the second found)."""

    stored: list[str]
    existing: list[str]
    expired: list[str]
    existing_entries: list[OutboxEntry] = field(default_factory=list, repr=False)


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
