"""The Envelope value object and the message id and expiry rules.

Every message eoguard carries is an :class:`Envelope`; on Kafka it is encoded by
:class:`eoguard.codec.EnvelopeCodec` against ``schemas/envelope.avsc``.

Ids:

- :func:`new_message_id` returns a UUIDv7 (RFC 9562) from uuid-utils (the Rust ``uuid``
  crate's ``now_v7``, about five times faster than the same in Python): 48 bits of Unix epoch
  milliseconds, a 42-bit counter that starts at a random value each new millisecond and is
  incremented for every further id in it (RFC 9562 §6.2, method 1; a clock that steps back
  keeps the last timestamp and counts on), then 32 random bits. Ids from one process are
  therefore strictly increasing, even within one millisecond; ids of different processes
  collide only with the same millisecond, counter and 32 random bits.
- :func:`derived_message_id` returns a deterministic UUIDv8 for the ``index``-th message a
  handler emits while processing ``parent_id``, so a retried read-process-write step
  produces the same ids and downstream dedup drops the repeats.
- :func:`message_id_for` returns a deterministic UUIDv5 for a business key (an order number,
  say) in a namespace, so an application that sends the same thing again after its own crash
  sends it under the same id, and consumers handle it once.
- :func:`canonical_id` is how every reader turns an id from a topic into the text its keys
  are built from: any spelling of a UUID becomes lowercase hyphenated text; anything else is
  refused. The Spark job applies the same steps as Column expressions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import time
import uuid
from dataclasses import dataclass, field

import uuid_utils

__all__ = [
    "Envelope",
    "canonical_id",
    "derived_message_id",
    "message_id_for",
    "namespace_uuid",
    "new_message_id",
    "now_ms",
]


def now_ms() -> int:
    """Wall-clock time as integer epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """One message as eoguard carries it: id, expiry, provenance and the payload bytes.

    ``payload_schema`` is the full name of the Avro schema the payload is encoded with
    (see :class:`eoguard.codec.PayloadCodec`), or ``None`` for raw application bytes;
    ``payload_fingerprint`` names the exact version of it that wrote the payload (``None``
    for raw bytes, and in envelopes from before version 3). Times are epoch milliseconds (UTC).
    """

    id: str
    expires_at_ms: int
    created_at_ms: int
    producer: str
    attempt: int
    payload_schema: str | None
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)
    payload_fingerprint: bytes | None = None

    def is_expired(self, now_ms: int | None = None) -> bool:
        """True once ``now_ms`` (default: the wall clock) has reached ``expires_at_ms``."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return now >= self.expires_at_ms

    def with_attempt(self, attempt: int) -> Envelope:
        """A copy with ``attempt`` replaced (a resend keeps the id, times and payload)."""
        return dataclasses.replace(self, attempt=attempt)

    @classmethod
    def create(
        cls,
        payload: bytes,
        *,
        ttl_ms: int,
        producer: str,
        payload_schema: str | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
        created_at_ms: int | None = None,
        payload_fingerprint: bytes | None = None,
    ) -> Envelope:
        """A first-attempt envelope, created now, expiring ``ttl_ms`` later, with a new id
        unless ``message_id`` (canonical UUID text) is given."""
        created = now_ms() if created_at_ms is None else created_at_ms
        return cls(
            id=new_message_id() if message_id is None else message_id,
            expires_at_ms=created + ttl_ms,
            created_at_ms=created,
            producer=producer,
            attempt=1,
            payload_schema=payload_schema,
            payload=payload,
            headers={} if headers is None else dict(headers),
            payload_fingerprint=payload_fingerprint,
        )


# --- UUIDv7 ----------------------------------------------------------------------------

_VERSION_8 = 0x8 << 76
_VARIANT = 0b10 << 62
_VARIANT_NIBBLE = {c: "89ab"[int(c, 16) & 0x3] for c in "0123456789abcdef"}
"""The RFC 9562 variant of a hex digit at a UUID's 17th place: its top two bits made 10."""
_RAND_MASK = (1 << 74) - 1  # the 74 free bits of a UUIDv7/v8 (rand_a and rand_b)

# uuid-utils keeps its generator's random state in Rust: a forked child would draw the same
# random bits as its parent (and continue the same counter), so reseed it in the child.
os.register_at_fork(after_in_child=uuid_utils.reseed_rng)
_uuid7 = uuid_utils.uuid7


def _format(value: int) -> str:
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_message_id() -> str:
    """A new UUIDv7 (canonical 36-char string), strictly increasing within this process."""
    return str(_uuid7())


def derived_message_id(parent_id: str, index: int) -> str:
    """The deterministic id of the ``index``-th message derived from ``parent_id``.

    A UUIDv8: its first 48 bits are the parent's (the parent's timestamp for a UUIDv7
    parent, so derived ids sort near their parent); the remaining 74 free bits are the
    first bits of ``SHA-256("eoguard.derived" || parent 16 bytes || index as 8-byte
    big-endian)``. Same inputs give the same id; different indexes give different ids.
    Raises ``ValueError`` for a parent that is not a UUID or a negative index.
    """
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    parent = uuid.UUID(parent_id)
    digest = hashlib.sha256(
        b"eoguard.derived" + parent.bytes + index.to_bytes(8, "big")
    ).digest()
    bits = int.from_bytes(digest[:10], "big") & _RAND_MASK
    rand_a = bits >> 62
    rand_b = bits & ((1 << 62) - 1)
    head = parent.int >> 80
    return _format((head << 80) | _VERSION_8 | (rand_a << 64) | _VARIANT | rand_b)


# --- Ids from outside: canonical text and business keys --------------------------------

MAX_ID_CHARS = 47
"""The longest id text accepted: ``urn:uuid:`` and the braced 38-character form."""

_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_SPELLED = re.compile(
    r"([0-9a-f]{8})-?([0-9a-f]{4})-?([0-9a-f]{4})-?([0-9a-f]{4})-?([0-9a-f]{12})").fullmatch


def canonical_id(text: str) -> str | None:
    """``text`` as lowercase hyphenated UUID text, or ``None`` when it is not a UUID.

    Accepted spellings, in this order of steps (the Spark job's decode mirrors them):
    at most :data:`MAX_ID_CHARS` characters; lowercased; an optional ``urn:uuid:`` prefix
    removed; optional surrounding braces removed; then 32 hex digits, with or without the
    four hyphens at their usual places. ``uuid.UUID`` is not used: it also accepts hyphens
    anywhere, ``+`` and ``_`` inside the digits.
    """
    if _CANONICAL(text):  # the common case: eoguard's own ids
        return text
    if len(text) > MAX_ID_CHARS:
        return None
    low = text.lower()
    if low.startswith("urn:uuid:"):
        low = low[9:]
    if low.startswith("{") and low.endswith("}"):
        low = low[1:-1]
    match = _SPELLED(low)
    return None if match is None else "-".join(match.groups())


_BUSINESS_NAMESPACE = uuid.UUID("6f1c9a52-3e0b-5d7a-9b44-0e6a1f3c2d18")
"""Fixed root under which :func:`message_id_for` turns a namespace name into a UUID."""


@functools.lru_cache(maxsize=256)
def _namespace(name: str) -> uuid.UUID:
    """The UUID of a namespace name (cached: a plain-topic consumer's id rule calls
    :func:`message_id_for` once per record, and this is half its cost)."""
    return uuid.uuid5(_BUSINESS_NAMESPACE, name)


def namespace_uuid(name: str) -> uuid.UUID:
    """The UUID :func:`message_id_for` hashes keys under for namespace ``name`` (the Spark job
    spells the rest of UUIDv5 as Columns)."""
    return _namespace(name)


def message_id_for(namespace: str | uuid.UUID, key: str | bytes) -> str:
    """The stable message id of business key ``key`` in ``namespace`` (a UUIDv5).

    The same namespace and key always give the same id, in any process or language that
    computes RFC 9562 UUIDv5: ``namespace`` given as text is first made a UUID itself
    (``uuid5(6f1c9a52-3e0b-5d7a-9b44-0e6a1f3c2d18, namespace)``), then the id is
    ``uuid5(namespace, key)`` with ``key`` as UTF-8. Pick one namespace per kind of thing
    sent (``"orders"``), so equal keys of different kinds do not collide.
    """
    ns = namespace if isinstance(namespace, uuid.UUID) else _namespace(namespace)
    name = key.encode() if isinstance(key, str) else key
    # uuid.uuid5's steps, spelled on the hex digest: no UUID object per call (a plain-topic
    # consumer's id rule runs once per record; this is a third of uuid.uuid5's cost).
    h = hashlib.sha1(ns.bytes + name, usedforsecurity=False).hexdigest()
    variant = _VARIANT_NIBBLE[h[16]]  # RFC 9562 variant: the nibble's top two bits 10
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"  # version 5

