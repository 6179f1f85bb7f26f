"""Untrusted input: what a decoded envelope must satisfy before any Redis key is built from it.

A topic may hold records no eoguard producer wrote. A record that decodes but breaks a rule
below is malformed (:class:`InvalidEnvelopeError`): dead-lettered with the rule it broke,
never claimed, and the records around it handled. The rules:

1. ``id`` is a UUID in any of the spellings :func:`eoguard.envelope.canonical_id` accepts; it
   is normalised to lowercase hyphenated text (keys and the handler see that form).
2. ``expires_at`` is not before ``created_at``, and not beyond ``now + max_ttl`` (plus
   :attr:`InputLimits.clock_skew_ms`, so a producer whose clock runs ahead of the reader's
   and sends with the longest TTL is not refused).
3. ``attempt`` is at least 1.
4. Sizes: ``producer``, ``headers`` and ``payload`` are within :class:`InputLimits`.

The Spark job applies the same rules as Column expressions (``eoguard_spark.decode``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from eoguard.envelope import MAX_ID_CHARS, Envelope, canonical_id
from eoguard.errors import ConfigError, InvalidEnvelopeError

__all__ = ["InputLimits", "check_envelope", "header_bytes"]


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Size limits on the fields of an envelope read from a topic (docs/design.md §3).

    The defaults sit well above what an eoguard producer writes (its whole record is at
    most ``max_message_bytes``, 1 MB by default, as Kafka's own default) and well below
    what would strain a consumer; raise them together with Kafka's ``message.max.bytes``.
    """

    producer_chars: int = 256
    """An eoguard producer id is host-pid-random, about 40 characters."""
    header_count: int = 64
    header_bytes: int = 16_384
    """Keys and values together, UTF-8."""
    payload_bytes: int = 8_388_608
    """8 MiB: eight times Kafka's default record limit."""
    clock_skew_ms: int = 300_000
    """How far ahead of the reader's clock a producer's clock may run (5 minutes)."""

    def within_grace(self, grace_ms: int) -> InputLimits:
        """These limits with ``clock_skew_ms`` at most ``grace_ms`` (see the consumer's
        ``effective_limits``)."""
        if self.clock_skew_ms <= grace_ms:
            return self
        return dataclasses.replace(self, clock_skew_ms=grace_ms)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"InputLimits.{f.name} must be an integer >= 0, got {value!r}")


def header_bytes(headers: dict[str, str]) -> int:
    """Keys and values of ``headers`` together, in UTF-8 bytes (a lone surrogate counts as the
    replacement it would be written as, so this never raises)."""
    return sum(len(k.encode("utf-8", "replace")) + len(v.encode("utf-8", "replace"))
               for k, v in headers.items())


def check_envelope(env: Envelope, *, now_ms: int, max_ttl_ms: int,
                   limits: InputLimits) -> Envelope:
    """``env`` with its id normalised; :class:`InvalidEnvelopeError` naming the broken rule."""
    mid = canonical_id(env.id)
    if mid is None:
        shown = env.id if len(env.id) <= MAX_ID_CHARS else f"{env.id[:MAX_ID_CHARS]}..."
        raise InvalidEnvelopeError(  # quoted as the Spark job quotes it: the same reason
            f"id '{shown}' ({len(env.id)} characters) is not a UUID", rule="id")
    expires_at, created_at = env.expires_at_ms, env.created_at_ms
    if expires_at < created_at:
        raise InvalidEnvelopeError(
            f"expires_at {expires_at} is before created_at {created_at}", rule="expiry")
    if expires_at > now_ms + max_ttl_ms + limits.clock_skew_ms:
        raise InvalidEnvelopeError(
            f"expires_at {expires_at} is beyond now + max_ttl ({now_ms} + {max_ttl_ms} ms)",
            rule="expiry")
    if env.attempt < 1:
        raise InvalidEnvelopeError(f"attempt {env.attempt} is below 1", rule="attempt")
    if len(env.producer) > limits.producer_chars:
        raise InvalidEnvelopeError(
            f"producer is {len(env.producer)} characters, over {limits.producer_chars}",
            rule="size")
    if len(env.payload) > limits.payload_bytes:
        raise InvalidEnvelopeError(
            f"payload is {len(env.payload)} bytes, over {limits.payload_bytes}", rule="size")
    headers = env.headers
    if headers:
        if len(headers) > limits.header_count:
            raise InvalidEnvelopeError(
                f"{len(headers)} headers, over {limits.header_count}", rule="size")
        size = header_bytes(headers)
        if size > limits.header_bytes:
            raise InvalidEnvelopeError(
                f"headers are {size} bytes, over {limits.header_bytes}", rule="size")
    return env if mid is env.id else dataclasses.replace(env, id=mid)
