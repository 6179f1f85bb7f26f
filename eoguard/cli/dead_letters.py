"""Dead letters read back for ``eoguard dlq``: what a filter selects, and each one's next
attempt, the same message sent again so the dedup store decides (docs/operations.md).

A dead letter is the original record byte for byte (value, key, headers) plus the headers the
consumer added (:mod:`eoguard.consumer.dead_letter`). Its next attempt goes to the topic it
came from (``eoguard.source.topic``), to the partition it was read from, and is:

- a record in the header format (docs/design.md §3): the value, key and original headers as
  they were, ``ce_eoguardattempt`` raised by one;
- an envelope: the same envelope (id, times, payload, headers) with ``attempt`` raised by one,
  in the current envelope version (every reader that could read the dead letter reads it).

Nothing else is replayed, each with its reason: a record that does not decode has no id to
keep; a plain record's id comes from its consumer's id rule, which may read its position or
timestamp, and both change in a new record; an expired message is dropped by every scope;
a dead letter without its source topic has nowhere to go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from eoguard.cli import render
from eoguard.codec import MAGIC, EnvelopeCodec
from eoguard.codec.headers import ATTEMPT, HeaderFields, read_headers
from eoguard.consumer.dead_letter import (
    ATTEMPTS,
    ERROR_TYPE,
    MESSAGE_ID,
    REASON,
    SCOPE,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    DeadLetter,
)
from eoguard.envelope import canonical_id
from eoguard.errors import CodecError

MAX_ATTEMPT = 2**31 - 1  # an Avro int, the envelope's and the header's bound
_WHOLE = re.compile(r"-?[0-9]{1,19}")


@dataclass(frozen=True)
class Filter:
    """Which dead letters a command takes: every given criterion must hold (an empty one
    holds for all)."""

    reasons: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    sources: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.reasons or self.ids or self.sources) and \
            self.since_ms is None and self.until_ms is None

    def matches(self, letter: Letter) -> bool:
        at = letter.timestamp_ms
        return ((not self.reasons or letter.dead.kind in self.reasons)
                and (not self.ids or letter.id in self.ids)
                and (not self.sources or letter.dead.source_topic in self.sources)
                and (self.since_ms is None or (at is not None and at >= self.since_ms))
                and (self.until_ms is None or (at is not None and at < self.until_ms)))


@dataclass
class Letter:
    """One dead letter: where it is, what it says, and its next attempt (or why none)."""

    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    dead: DeadLetter
    format: str = "other"  # envelope, headers, other
    id: str | None = None
    attempt: int | None = None
    expires_at_ms: int | None = None
    value: bytes = b""  # the next attempt's value
    headers: list[tuple[str, bytes]] = field(default_factory=list)  # the next attempt's
    skip: str | None = None  # why it is not replayed
    outcome: dict[str, Any] = field(default_factory=dict)  # set by a replay
    states: dict[str, str] = field(default_factory=dict)  # the id's state per --scope

    @property
    def target(self) -> tuple[str, int]:
        """Where the next attempt goes: the source topic and partition (-1: by key)."""
        partition = _int(self.dead.added.get(SOURCE_PARTITION))
        return self.dead.source_topic, -1 if partition is None or partition < 0 else partition

    def as_data(self) -> dict[str, Any]:
        added = self.dead.added
        return {
            "partition": self.partition, "offset": self.offset,
            "dead_lettered_at": render.iso_ms(self.timestamp_ms),
            "reason": self.dead.kind or None, "error_type": added.get(ERROR_TYPE),
            "error": added.get(REASON), "handler_attempts": _int(added.get(ATTEMPTS)),
            "scope": added.get(SCOPE),
            "source": {"topic": self.dead.source_topic or None,
                       "partition": _int(added.get(SOURCE_PARTITION)),
                       "offset": _int(added.get(SOURCE_OFFSET))},
            "id": self.id, "format": self.format, "attempt": self.attempt,
            "expires_at": render.iso_ms(self.expires_at_ms),
            "replayable": self.skip is None, "skip_reason": self.skip, "dedup": self.states,
            **self.outcome,
        }


def _int(text: str | None) -> int | None:
    """A header's whole number (ASCII digits, as the consumer writes it), else None."""
    return int(text) if text is not None and _WHOLE.fullmatch(text) else None


def read_letter(message: Message, codec: EnvelopeCodec, now_ms: int) -> Letter:
    """A dead-letter record as a :class:`Letter` with its next attempt; never raises for a
    record that is not replayable (its ``skip`` says why)."""
    stamp_type, stamp = message.timestamp()
    dead = DeadLetter.split(message.headers())
    letter = Letter(partition=message.partition() or 0, offset=message.offset() or 0,
                    timestamp_ms=stamp if stamp_type and stamp >= 0 else None,
                    key=message.key(), dead=dead,
                    id=canonical_id(dead.added.get(MESSAGE_ID, "")))
    letter.skip = _next_attempt(letter, message.value(), codec)
    if letter.skip is None and letter.expires_at_ms is not None and letter.expires_at_ms <= now_ms:
        letter.skip = f"expired at {render.iso_ms(letter.expires_at_ms)}: every scope drops it"
    if letter.skip is None and not dead.source_topic:
        letter.skip = "no eoguard.source.topic header: the topic it came from is unknown"
    return letter


def _next_attempt(letter: Letter, value: bytes | None, codec: EnvelopeCodec) -> str | None:
    """Fill the letter's id, attempt and next attempt; the reason there is none, or None."""
    try:
        fields = read_headers(letter.dead.headers)
    except CodecError as exc:
        return f"headers: {exc}"
    if fields is not None:
        return _raised_header(letter, fields, value)
    if value is None or value[:len(MAGIC)] != MAGIC:
        return ("not an eoguard message (neither an envelope nor the header format): a plain "
                "record's id may depend on its position, a malformed one has none")
    return _raised_envelope(letter, value, codec)


def _raised_header(letter: Letter, fields: HeaderFields, value: bytes | None) -> str | None:
    """The header format's next attempt: ``ce_eoguardattempt`` + 1, all else as it was."""
    letter.format, letter.id = "headers", canonical_id(fields.id) or fields.id
    letter.attempt, letter.expires_at_ms = fields.attempt, fields.expires_at_ms
    if fields.attempt >= MAX_ATTEMPT:
        return f"attempt {fields.attempt} cannot be raised"
    letter.value = value or b""
    letter.headers = [(name, str(fields.attempt + 1).encode()) if name.lower() == ATTEMPT
                      else (name, data) for name, data in letter.dead.headers]
    return None


def _raised_envelope(letter: Letter, value: bytes, codec: EnvelopeCodec) -> str | None:
    """The envelope's next attempt: the envelope with ``attempt`` + 1."""
    try:
        envelope = codec.decode(value)
    except CodecError as exc:
        return f"envelope: {exc}"
    letter.format, letter.id = "envelope", canonical_id(envelope.id) or envelope.id
    letter.attempt, letter.expires_at_ms = envelope.attempt, envelope.expires_at_ms
    if envelope.attempt >= MAX_ATTEMPT:
        return f"attempt {envelope.attempt} cannot be raised"
    try:
        letter.value = codec.encode(envelope.with_attempt(envelope.attempt + 1))
    except CodecError as exc:
        return f"envelope: {exc}"
    letter.headers = letter.dead.headers
    return None
