"""The one exception hierarchy of eoguard, grouped by what the caller does next.

Every error eoguard raises derives from :class:`EoguardError`; errors from fastavro,
redis-py and confluent-kafka are wrapped at the boundary (``raise ... from exc``). Below the
root, three groups say what to do: fix the input, retry later, or re-read the state::

    EoguardError
    ├── InvalidInputError           bad input: fix what was passed; the same call fails again
    │   ├── ConfigError             invalid configuration, found at construction
    │   ├── InvalidMessageError     a send argument is invalid (empty topic, bad ttl, value type)
    │   │   └── ReservedHeaderError     an application header takes a name the header format reserves
    │   ├── SchemaRefusedError      Schema Registry refused a payload schema (incompatible, unregistered)
    │   ├── MessageTooLargeError    an encoded record exceeds the configured maximum
    │   └── CodecError              a Kafka record value or payload cannot be (de)coded
    │       ├── BadMagicError           value does not start with the Avro single-object marker C3 01
    │       ├── UnknownFingerprintError schema fingerprint is not one eoguard knows
    │       ├── CorruptRecordError      body truncated or not valid Avro for its schema
    │       ├── SchemaNotFoundError     a payload schema named by a record or a caller is not loaded
    │       ├── PayloadEncodeError      a payload does not match the schema it is encoded with
    │       ├── UnknownSchemaIdError    a registry-framed value names a schema id the registry lacks
    │       ├── InvalidEnvelopeError    decoded, but breaks an input rule (id, expiry, size)
    │       └── InvalidRecordError      a plain record whose deserializer or id/lifetime rule failed
    ├── UnavailableError            a service failed or cannot be reached: retry later, with backoff
    │   ├── StoreError              Redis refused or failed an operation
    │   │   ├── StoreUnavailableError   Redis cannot be reached (connection, timeout, auth)
    │   │   │   └── StoreSecurityError      Redis refused the login, or its certificate is untrusted
    │   │   ├── StoreOutOfMemoryError   Redis is full (maxmemory under noeviction): OOM
    │   │   ├── ReplicationTimeoutError no replica acknowledged the writes in time (WAIT)
    │   │   └── FailoverUnderWayError   at start, a master lacks its replica while a node fails
    │   ├── BrokerError             Kafka refused or failed an operation
    │   │   └── BrokerUnavailableError  Kafka cannot be reached within the timeout
    │   │       └── BrokerSecurityError     Kafka refused the login, or its certificate is untrusted
    │   ├── RegistryUnavailableError  Schema Registry cannot be reached or failed (5xx, timeout)
    │   ├── DeadLetterError         a record could not be routed to the dead-letter topic
    │   ├── PersistError            persist-first mode could not write the outbox
    │   └── BackpressureError       the in-memory queue stayed full past the send timeout
    ├── StateError                  the state forbids the call: re-read it or stop; a retry fails too
    │   ├── ClaimNotOwnedError      a claim was completed or released by an owner that lost it
    │   ├── ProducerClosedError     send after close
    │   ├── ConsumerClosedError     poll after close
    │   └── ConsumerFencedError     librdkafka failed the consumer for good: close it, start anew
    ├── StackError                  the local stack (Kafka, Redis, jars) failed to start
    └── DemoError                   the demo could not run (a worker crashed, a topic not created)

:class:`SecurityError` is a mark, not a group: the two errors that carry it
(StoreSecurityError, BrokerSecurityError) say credentials or a certificate were refused, so
fix the configuration; ``except SecurityError`` catches both.
"""

from __future__ import annotations


class EoguardError(Exception):
    """Root of every error eoguard raises."""


# --- Bad input: fix what was passed --------------------------------------------------------


class InvalidInputError(EoguardError, ValueError):
    """Something the caller passed is invalid; the same call fails the same way again."""


class ConfigError(InvalidInputError):
    """Configuration is invalid; raised at construction, never later."""


class InvalidMessageError(InvalidInputError):
    """A ``send`` argument is invalid: empty topic, non-positive ttl, value of the wrong type."""


class ReservedHeaderError(InvalidMessageError):
    """A ``send`` header takes a name the header wire format reserves for eoguard's fields
    (docs/design.md §3, "The header format"); ``header`` is the name."""

    def __init__(self, message: str, *, header: str) -> None:
        super().__init__(message)
        self.header = header


class SchemaRefusedError(InvalidInputError):
    """Schema Registry refused a payload schema under ``subject``: incompatible with
    ``version`` (the subject's latest, None if unknown), or not registered where the producer
    registers nothing itself (``registered=False``). Fix the schema or register it."""

    def __init__(self, message: str, *, subject: str, version: int | None,
                 registered: bool = True) -> None:
        super().__init__(message)
        self.subject = subject
        self.version = version
        self.registered = registered


class MessageTooLargeError(InvalidInputError):
    """The encoded record is larger than the configured maximum; refused at ``send``."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class CodecError(InvalidInputError):
    """A Kafka record value or a payload could not be encoded or decoded."""


class BadMagicError(CodecError):
    """The value does not start with the Avro single-object marker ``C3 01``."""


class UnknownFingerprintError(CodecError):
    """The value's 8-byte schema fingerprint names no schema eoguard has loaded."""

    def __init__(self, message: str, *, fingerprint: bytes) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint


class CorruptRecordError(CodecError):
    """The Avro body is truncated or does not match its schema."""


class SchemaNotFoundError(CodecError):
    """A payload schema named by a record or by a caller is not loaded."""

    def __init__(self, message: str, *, schema: str) -> None:
        super().__init__(message)
        self.schema = schema


class PayloadEncodeError(CodecError):
    """A payload does not match the schema it is being encoded with."""


class UnknownSchemaIdError(CodecError):
    """A registry-framed value names a schema id Schema Registry does not have (``schema_id``)."""

    def __init__(self, message: str, *, schema_id: int) -> None:
        super().__init__(message)
        self.schema_id = schema_id


class InvalidEnvelopeError(CodecError):
    """An envelope decoded but breaks an input rule (``rule``: id, expiry, attempt, size)."""

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class InvalidRecordError(CodecError):
    """A plain record (not an envelope) whose deserializer or rule failed or gave nonsense
    (``rule``: value, id, lifetime, size): dead-lettered, never keyed."""

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


# --- A service failed: retry later -----------------------------------------------------------


class UnavailableError(EoguardError):
    """Redis, Kafka or the dead-letter producer failed or is unreachable; retry after a backoff.

    Also what a plain record's deserializer or rule reports for its service being down
    (eoguard/codec/plain.py): the consumer re-reads the record, never dead-letters it."""


class StoreError(UnavailableError):
    """Redis refused or failed an operation."""


class StoreUnavailableError(StoreError):
    """Redis cannot be reached: connection refused, timeout or authentication."""


class SecurityError(Exception):
    """Mark of the errors that say a service refused our credentials, or TLS refused the
    service's certificate (not an error of its own: every one is also an EoguardError).

    ``reason`` is ``"credentials"`` (wrong user or password) or ``"certificate"`` (the
    server's certificate is not signed by a trusted CA, or names another host). The same
    configuration fails again: a GuardedConsumer's ``poll_once`` raises it instead of
    backing off. The message is one line and holds no secret.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StoreSecurityError(StoreUnavailableError, SecurityError):
    """Redis refused the ACL user or password, or its TLS certificate is not trusted.

    Also a :class:`StoreUnavailableError`: loops that retry an unreachable Redis (a
    producer's outbox writer) retry this too, since credentials may be rotated meanwhile.
    """


class StoreOutOfMemoryError(StoreError):
    """Redis is full: maxmemory reached under ``noeviction`` refuses writes (an ``OOM`` reply)
    until keys expire or memory is added; retry later, nothing was written."""


class ReplicationTimeoutError(StoreError):
    """``durability="replicated"``: fewer replicas than asked acknowledged a round trip's
    writes within the timeout (WAIT); nothing is guaranteed on them, retry."""


class FailoverUnderWayError(StoreError):
    """``durability="replicated"``, at start: a master has fewer replicas than asked while the
    cluster reports a failing node (its replica was promoted, or is down): retry once the
    failover ends. Without a failing node the same shortage is a :class:`ConfigError`."""


class BrokerError(UnavailableError):
    """Kafka refused or failed an operation."""


class BrokerUnavailableError(BrokerError):
    """Kafka could not be reached within the timeout."""


class BrokerSecurityError(BrokerUnavailableError, SecurityError):
    """Kafka refused the SASL login, or its TLS certificate is not trusted (librdkafka's
    ``_AUTHENTICATION`` / ``_SSL`` errors); a GuardedConsumer's poll and a GuardedProducer's
    ``flush`` raise it."""


class RegistryUnavailableError(UnavailableError):
    """Schema Registry cannot be reached, timed out or failed (HTTP 5xx): retry later. A
    consumer re-reads the record after a backoff; it never dead-letters it for this."""


class DeadLetterError(UnavailableError):
    """A record could not be written to the dead-letter topic; its offset is not committed."""


class PersistError(UnavailableError):
    """persist-first mode could not write the outbox, so nothing was produced."""


class BackpressureError(UnavailableError):
    """The bounded in-memory queue stayed full for longer than the send timeout."""


# --- The state forbids the call: re-read it or stop ----------------------------------------


class StateError(EoguardError):
    """The call conflicts with the current state (an object closed, a claim lost)."""


class ClaimNotOwnedError(StateError):
    """A dedup claim was completed or released by an owner that no longer holds it."""

    def __init__(self, message: str, *, message_id: str, owner: str) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.owner = owner


class ProducerClosedError(StateError):
    """``send`` was called after the producer was closed."""


class ConsumerClosedError(StateError):
    """``poll_once`` or ``run`` was called after the consumer was closed."""


class ConsumerFencedError(StateError):
    """librdkafka failed the consumer for good (a fatal error: another member holds its
    ``group.instance.id``, or Kafka fenced it after a coordinator moved); it never consumes
    again, so ``poll_once`` raises instead of retrying: close it and start a new consumer."""


# --- The tools around the library ------------------------------------------------------------


class StackError(EoguardError):
    """The local stack could not start a service; the message names its log file."""


class DemoError(EoguardError):
    """``eoguard-dev demo`` could not run: a worker process crashed or a topic was not created."""
