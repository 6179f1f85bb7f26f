"""The Envelope value object and the message id and expiry rules.

Every message eoguard carries is an :class:`Envelope`; on Kafka it is encoded by
:class:`eoguard.codec.EnvelopeCodec` against ``schemas/envelope.avsc``.

Ids:

- :func:`new_message_id` returns a UUIDv7 (RFC 9562): 48 bits of Unix epoch milliseconds,
  then 74 bits that start at a random value each new millisecond and are incremented by one
  for every further id in the same millisecond (RFC 9562 §6.2, method 3). Ids from one
  process are therefore strictly increasing, even within one millisecond and even if the
  wall clock steps back; ids from different processes collide only if two random 73-bit
  starting points land within a few thousand of each other.
- :func:`derived_message_id` returns a deterministic UUIDv8 for the ``index``-th message a
  handler emits while processing ``parent_id``, so a retried read-process-write step
  produces the same ids and downstream dedup drops the repeats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import uuid
from dataclasses import dataclass, field

__all__ = ["Envelope", "derived_message_id", "new_message_id", "now_ms"]


def now_ms() -> int:
    """Wall-clock time as integer epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """One message as eoguard carries it: id, expiry, provenance and the payload bytes.

    ``payload_schema`` is the full name of the Avro schema the payload is encoded with
    (see :class:`eoguard.codec.PayloadCodec`), or ``None`` for raw application bytes.
    Times are epoch milliseconds (UTC).
    """

    id: str
    expires_at_ms: int
    created_at_ms: int
    producer: str
    attempt: int
    payload_schema: str | None
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)

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
    ) -> Envelope:
        """A first-attempt envelope with a new id, created now, expiring ``ttl_ms`` later."""
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
        )


# --- UUIDv7 ----------------------------------------------------------------------------

_RAND_BITS = 74  # 12 bits rand_a + 62 bits rand_b, treated as one counter
_RAND_MASK = (1 << _RAND_BITS) - 1
_VERSION_7 = 0x7 << 76
_VERSION_8 = 0x8 << 76
_VARIANT = 0b10 << 62


class _V7State:
    """Last timestamp and counter of this process; guarded by a lock, reseeded after fork."""

    __slots__ = ("counter", "last_ms", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_ms = -1
        self.counter = 0

    def reseed(self) -> None:
        # A forked child must not continue the parent's sequence (it would repeat its ids).
        self.lock = threading.Lock()
        self.last_ms = -1


_state = _V7State()
os.register_at_fork(after_in_child=_state.reseed)


def _random_start() -> int:
    # Top bit clear: leaves 2**73 increments of room before the counter could overflow.
    return int.from_bytes(os.urandom(10), "big") & (_RAND_MASK >> 1)


def _format(value: int) -> str:
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_message_id() -> str:
    """A new UUIDv7 (canonical 36-char string), strictly increasing within this process."""
    ms = time.time_ns() // 1_000_000
    state = _state
    with state.lock:
        if ms > state.last_ms:
            state.last_ms = ms
            state.counter = _random_start()
        else:
            # Same millisecond, or the clock stepped back: keep the last timestamp, count up.
            state.counter += 1
            if state.counter > _RAND_MASK:  # unreachable in practice; stay monotonic anyway
                state.last_ms += 1
                state.counter = _random_start()
        ms = state.last_ms
        counter = state.counter
    rand_a = counter >> 62
    rand_b = counter & ((1 << 62) - 1)
    return _format((ms << 80) | _VERSION_7 | (rand_a << 64) | _VARIANT | rand_b)


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
