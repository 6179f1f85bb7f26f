"""Plain records: Kafka records no eoguard producer wrote, read by a GuardedConsumer
(docs/design.md §6, "Plain topics").

A consumer given :class:`PlainRecords` handles records that are not envelopes the way it
handles envelopes: the application's rules say what an envelope would have said.

- ``deserializer`` turns the record value into what the handler gets as ``ctx.payload``
  (any callable ``bytes -> value``: ``json.loads``, confluent-kafka's ``AvroDeserializer``
  bound to its context, a protobuf parser, ``bytes``);
- ``id_rule`` gives the message id from the :class:`PlainRecord` (a UUID string, normalised
  by :func:`eoguard.envelope.canonical_id`; derive it from a business key with
  :func:`eoguard.envelope.message_id_for`);
- ``lifetime`` (:class:`Lifetime`) gives its expiry: the record's timestamp plus a TTL, an
  epoch-ms header, an epoch-ms field of the decoded value, or a rule of the application's.

Which records are envelopes (:meth:`EnvelopeHeads.holds`): a value whose first 10 bytes are
the Avro single-object marker ``C3 01`` and the fingerprint of an envelope version this
reader has loaded. Everything else is plain: also an Avro single-object record of another
schema, and an envelope of a version this reader does not know (upgrade readers first, §3).

A record whose deserializer or rule raises, or gives what cannot be a key (not a UUID
string, a lifetime that is not an integer, beyond now + ``max_ttl``, or from a timestamp
the record lacks) is malformed: :class:`~eoguard.errors.InvalidRecordError` naming the
rule, dead-lettered, never keyed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eoguard.codec.envelope_codec import ENVELOPE_SCHEMA, HEADER_SIZE, MAGIC
from eoguard.codec.rules import InputLimits
from eoguard.codec.schemas import SchemaRegistry
from eoguard.envelope import MAX_ID_CHARS, Envelope, canonical_id, message_id_for
from eoguard.errors import ConfigError, InvalidRecordError

__all__ = [
    "EnvelopeHeads", "Lifetime", "PlainRecord", "PlainRecords", "business_key", "id_from_field",
    "id_from_header", "read_plain",
]


@dataclass(frozen=True, slots=True)
class PlainRecord:
    """A plain Kafka record as the rules see it: ``value`` is what the deserializer returned;
    ``timestamp_ms`` is None when Kafka has none; ``headers`` keeps the last value of a name."""

    value: Any
    raw: bytes
    key: bytes | None
    headers: Mapping[str, bytes]
    timestamp_ms: int | None
    topic: str
    partition: int
    offset: int


IdRule = Callable[[PlainRecord], str]
"""The message id of a plain record: a UUID string (``message_id_for(namespace, key)``)."""
ExpiryRule = Callable[[PlainRecord], int]
"""The expiry of a plain record, epoch milliseconds UTC."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Lifetime:
    """Where a plain record's expiry comes from: exactly one of

    - ``ttl_s``: the record's Kafka timestamp plus this TTL (a record without a timestamp is
      malformed);
    - ``header``: a header holding the expiry as epoch-ms ASCII digits;
    - ``field``: a key of the decoded value (a mapping) holding the expiry as epoch-ms;
    - ``rule``: a callable on the :class:`PlainRecord` returning the epoch-ms expiry.
    """

    ttl_s: float | None = None
    header: str | None = None
    field: str | None = None
    rule: ExpiryRule | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("ttl_s", "header", "field", "rule")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError(f"Lifetime needs exactly one of ttl_s, header, field or rule; "
                              f"got {given or 'none'}")
        ttl = self.ttl_s
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
                                or not math.isfinite(ttl) or ttl <= 0):
            raise ConfigError(f"Lifetime.ttl_s must be a positive number, got {ttl!r}")
        for name in ("header", "field"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"Lifetime.{name} must be a non-empty string, got {value!r}")
        if self.rule is not None and not callable(self.rule):
            raise ConfigError("Lifetime.rule must be callable")

    def expires_at_ms(self, record: PlainRecord) -> int:
        """The record's expiry; raises what the rule raises (the caller wraps it)."""
        if self.ttl_s is not None:
            if record.timestamp_ms is None:
                raise ValueError("the record has no timestamp")
            return record.timestamp_ms + int(self.ttl_s * 1000)
        if self.header is not None:
            return int(record.headers[self.header].decode("ascii"))
        if self.field is not None:
            return _integer(record.value[self.field])
        assert self.rule is not None
        return _integer(self.rule(record))


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"an expiry is an integer of epoch milliseconds, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class PlainRecords:
    """How a GuardedConsumer reads records that are not envelopes (module docstring)."""

    deserializer: Callable[[bytes], Any]
    id_rule: IdRule
    lifetime: Lifetime

    def __post_init__(self) -> None:
        if not callable(self.deserializer):
            raise ConfigError("PlainRecords.deserializer must be callable (bytes -> value)")
        if not callable(self.id_rule):
            raise ConfigError("PlainRecords.id_rule must be callable (PlainRecord -> UUID string)")
        if not isinstance(self.lifetime, Lifetime):
            raise ConfigError("PlainRecords.lifetime must be a Lifetime")

    def check(self, *, max_ttl_ms: int) -> None:
        """Refuse a TTL that would outlive the key prefix's ``max_ttl`` (at construction)."""
        ttl = self.lifetime.ttl_s
        if ttl is not None and ttl * 1000 > max_ttl_ms:
            raise ConfigError(f"Lifetime.ttl_s ({ttl}) exceeds the key prefix's max_ttl_ms "
                              f"({max_ttl_ms})")


def business_key(value: object) -> str | bytes:
    """What :func:`~eoguard.envelope.message_id_for` hashes for a key found in a record: text
    as its UTF-8, an integer (not a bool) as its decimal digits (``42`` and ``"42"`` are one
    key), bytes (a header's value) as they are. Anything else (a float, a bool, null, a
    structure) is refused with TypeError: its text would differ between languages. The Spark
    job's ``PlainOptions`` follows the same rule (connectors/spark/README.md)."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"a business key is text, an integer or bytes, got {type(value).__name__}")


def id_from_field(namespace: str, field: str) -> IdRule:
    """An id rule: ``message_id_for(namespace, business_key(value[field]))``."""
    def rule(record: PlainRecord) -> str:
        return message_id_for(namespace, business_key(record.value[field]))
    return rule


def id_from_header(namespace: str, header: str) -> IdRule:
    """An id rule: ``message_id_for(namespace, <the header's bytes>)`` (its last value)."""
    def rule(record: PlainRecord) -> str:
        return message_id_for(namespace, record.headers[header])
    return rule


class EnvelopeHeads:
    """The first 10 bytes of every envelope version a reader has loaded: the one cheap check
    that tells an envelope from a plain record."""

    __slots__ = ("heads",)

    def __init__(self, registry: SchemaRegistry) -> None:
        self.heads = frozenset(MAGIC + s.fingerprint for s in registry.versions(ENVELOPE_SCHEMA))

    def holds(self, value: bytes | None) -> bool:
        """Whether ``value`` is read as an envelope (module docstring)."""
        return value is not None and value[:HEADER_SIZE] in self.heads


def _headers(raw: Iterable[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]
             | None) -> dict[str, bytes]:
    """Kafka headers as a dict (the last value of a name; a header without a value dropped)."""
    pairs = raw.items() if isinstance(raw, Mapping) else raw or ()
    return {name: value.encode() if isinstance(value, str) else value
            for name, value in pairs if value is not None}


def read_plain(rules: PlainRecords, value: bytes | None, *, key: bytes | None,
               headers: Iterable[tuple[str, str | bytes | None]]
               | Mapping[str, str | bytes | None] | None, timestamp_ms: int | None,
               topic: str, partition: int, offset: int, now_ms: int, max_ttl_ms: int,
               limits: InputLimits) -> tuple[Envelope, Any]:
    """The synthetic envelope of a plain record (id and expiry from the rules) and its payload;
    :class:`InvalidRecordError` naming the rule that failed.

    The envelope has ``producer=""``, ``attempt=1``, ``created_at_ms`` the record's timestamp
    (now when it has none, never after the expiry), ``payload_schema=None``, ``payload`` the
    raw value and ``headers`` the Kafka headers as text.
    """
    raw = b"" if value is None else value
    if len(raw) > limits.payload_bytes:
        raise InvalidRecordError(f"value is {len(raw)} bytes, over {limits.payload_bytes}",
                                 rule="size")
    try:
        decoded = rules.deserializer(raw)
    except Exception as exc:  # any error of the application's callables makes it malformed
        raise InvalidRecordError(f"deserializer raised {type(exc).__name__}: {exc}",
                                 rule="value") from exc
    record = PlainRecord(decoded, raw, key, _headers(headers), timestamp_ms, topic, partition,
                         offset)
    try:
        given = rules.id_rule(record)
    except Exception as exc:
        raise InvalidRecordError(f"id rule raised {type(exc).__name__}: {exc}",
                                 rule="id") from exc
    mid = canonical_id(given) if isinstance(given, str) else None
    if mid is None:
        shown = repr(given)
        shown = shown if len(shown) <= MAX_ID_CHARS else f"{shown[:MAX_ID_CHARS]}..."
        raise InvalidRecordError(f"id rule returned {shown}, not a UUID string", rule="id")
    try:
        expires_at = rules.lifetime.expires_at_ms(record)
    except Exception as exc:
        raise InvalidRecordError(f"lifetime rule failed: {type(exc).__name__}: {exc}",
                                 rule="lifetime") from exc
    if expires_at > now_ms + max_ttl_ms + limits.clock_skew_ms:
        raise InvalidRecordError(
            f"expires_at {expires_at} is beyond now + max_ttl ({now_ms} + {max_ttl_ms} ms)",
            rule="lifetime")
    created = now_ms if timestamp_ms is None else timestamp_ms
    envelope = Envelope(id=mid, expires_at_ms=expires_at, created_at_ms=min(created, expires_at),
                        producer="", attempt=1, payload_schema=None, payload=raw,
                        headers={k: v.decode("utf-8", "replace")
                                 for k, v in record.headers.items()})
    return envelope, decoded
