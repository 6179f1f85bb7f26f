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
string, a lifetime that is not an integer, before the record's timestamp, beyond now +
``max_ttl``, or from a timestamp the record lacks) is malformed:
:class:`~eoguard.errors.InvalidRecordError` naming the rule, dead-lettered, never keyed.

Except a service outage: a deserializer or rule that raises an eoguard
:class:`~eoguard.errors.UnavailableError` (retry later), or a builtin ``ConnectionError`` or
``TimeoutError`` (confluent-kafka's ``AvroDeserializer`` while Schema Registry is down), says
nothing about the record. :func:`read_plain` raises it as an ``UnavailableError``, and the
consumer re-reads the record after a backoff, as when Redis fails (``stats().store_outages``);
it is never dead-lettered for it.
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
from eoguard.errors import ConfigError, InvalidRecordError, UnavailableError

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
    """How a GuardedConsumer reads records that are not envelopes (module docstring).

    What the callables raise decides the record's fate: an eoguard ``UnavailableError``, a
    ``ConnectionError`` or a ``TimeoutError`` means "retry later" (the record is re-read after
    a backoff, never dead-lettered: a Schema Registry outage loses nothing); any other
    exception means the record is malformed (dead-lettered with the reason).
    """

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


_OUTAGES = (UnavailableError, ConnectionError, TimeoutError)
"""What a deserializer or rule raises when its service is down: retry later (module
docstring)."""


def _refused(what: str, exc: Exception, *, rule: str, where: str) -> Exception:
    """The error to raise for ``exc`` from the application's ``rule``: an UnavailableError
    for an outage (the record is re-read), else InvalidRecordError (dead-lettered)."""
    if isinstance(exc, _OUTAGES):
        return UnavailableError(f"plain record {where}: {what} "
                                f"{type(exc).__name__}: {exc} (re-read after a backoff)")
    return InvalidRecordError(f"{what} {type(exc).__name__}: {exc}", rule=rule)


def read_plain(rules: PlainRecords, value: bytes | None, *, key: bytes | None,
               headers: Iterable[tuple[str, str | bytes | None]]
               | Mapping[str, str | bytes | None] | None, timestamp_ms: int | None,
               topic: str, partition: int, offset: int, now_ms: int, max_ttl_ms: int,
               limits: InputLimits) -> tuple[Envelope, Any]:
    """The synthetic envelope of a plain record (id and expiry from the rules) and its payload;
    :class:`InvalidRecordError` naming the rule that failed; :class:`UnavailableError` when a
    deserializer or rule reports an outage (module docstring): read the record again later.

    The envelope has ``producer=""``, ``attempt=1``, ``created_at_ms`` the record's timestamp
    (now when it has none, never after the expiry; an expiry before the record's timestamp is
    refused, as an envelope's is), ``payload_schema=None``, ``payload`` the raw value and
    ``headers`` the Kafka headers as text.
    """
    raw = b"" if value is None else value
    where = f"{topic}[{partition}]@{offset}"
    if len(raw) > limits.payload_bytes:
        raise InvalidRecordError(f"value is {len(raw)} bytes, over {limits.payload_bytes}",
                                 rule="size")
    try:
        decoded = rules.deserializer(raw)
    except Exception as exc:  # an outage: retry later; any other error: malformed
        raise _refused("deserializer raised", exc, rule="value", where=where) from exc
    record = PlainRecord(decoded, raw, key, _headers(headers), timestamp_ms, topic, partition,
                         offset)
    try:
        given = rules.id_rule(record)
    except Exception as exc:
        raise _refused("id rule raised", exc, rule="id", where=where) from exc
    mid = canonical_id(given) if isinstance(given, str) else None
    if mid is None:
        shown = repr(given)
        shown = shown if len(shown) <= MAX_ID_CHARS else f"{shown[:MAX_ID_CHARS]}..."
        raise InvalidRecordError(f"id rule returned {shown}, not a UUID string", rule="id")
    try:
        expires_at = rules.lifetime.expires_at_ms(record)
    except Exception as exc:
        raise _refused("lifetime rule failed:", exc, rule="lifetime", where=where) from exc
    if timestamp_ms is not None and expires_at < timestamp_ms:  # as an envelope's (§3)
        raise InvalidRecordError(
            f"expires_at {expires_at} is before the record's timestamp {timestamp_ms} "
            f"(an expiry in seconds where epoch milliseconds are expected?)", rule="lifetime")
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
