"""The one exception hierarchy of eoguard.

Every error eoguard raises derives from :class:`EoguardError`; errors from fastavro,
redis-py and confluent-kafka are wrapped at the boundary (``raise ... from exc``)::

    EoguardError
    ├── ConfigError                 invalid configuration, found at construction
    ├── CodecError                  a Kafka record value or payload cannot be (de)coded
    │   ├── BadMagicError           value does not start with the Avro single-object marker C3 01
    │   ├── UnknownFingerprintError schema fingerprint is not one eoguard knows
    │   ├── CorruptRecordError      body truncated or not valid Avro for its schema
    │   ├── SchemaNotFoundError     a payload schema named by a record or a caller is not loaded
    │   └── PayloadEncodeError      a payload does not match the schema it is encoded with
    ├── StoreError                  Redis refused or failed an operation
    │   ├── StoreUnavailableError   Redis cannot be reached (connection, timeout, auth)
    │   └── ClaimNotOwnedError      a claim was completed or released by an owner that lost it
    ├── BrokerError                 Kafka refused or failed an operation
    │   └── BrokerUnavailableError  Kafka cannot be reached within the timeout
    ├── ProducerError
    │   ├── InvalidMessageError     a send argument is invalid (empty topic, bad ttl, value type)
    │   ├── MessageTooLargeError    an encoded record exceeds the configured maximum
    │   ├── BackpressureError       the in-memory queue stayed full past the send timeout
    │   ├── PersistError            persist-first mode could not write the outbox
    │   └── ProducerClosedError     send after close
    ├── ConsumerError
    │   └── DeadLetterError         a record could not be routed to the dead-letter topic
    ├── StackError                  the local stack (Kafka, Redis, jars) failed to start
    └── DemoError                   the demo could not run (a worker crashed, a topic not created)
"""

from __future__ import annotations


class EoguardError(Exception):
    """Root of every error eoguard raises."""


class ConfigError(EoguardError, ValueError):
    """Configuration is invalid; raised at construction, never later."""


class CodecError(EoguardError):
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


class StoreError(EoguardError):
    """Redis refused or failed an operation."""


class StoreUnavailableError(StoreError):
    """Redis cannot be reached: connection refused, timeout or authentication."""


class ClaimNotOwnedError(StoreError):
    """A dedup claim was completed or released by an owner that no longer holds it."""

    def __init__(self, message: str, *, message_id: str, owner: str) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.owner = owner


class BrokerError(EoguardError):
    """Kafka refused or failed an operation."""


class BrokerUnavailableError(BrokerError):
    """Kafka could not be reached within the timeout."""


class ProducerError(EoguardError):
    """A GuardedProducer operation failed."""


class InvalidMessageError(ProducerError, ValueError):
    """A ``send`` argument is invalid: empty topic, non-positive ttl, value of the wrong type."""


class MessageTooLargeError(ProducerError):
    """The encoded record is larger than the configured maximum; refused at ``send``."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class BackpressureError(ProducerError):
    """The bounded in-memory queue stayed full for longer than the send timeout."""


class PersistError(ProducerError):
    """persist-first mode could not write the outbox, so nothing was produced."""


class ProducerClosedError(ProducerError):
    """``send`` was called after the producer was closed."""


class ConsumerError(EoguardError):
    """A GuardedConsumer operation failed."""


class DeadLetterError(ConsumerError):
    """A record could not be written to the dead-letter topic; its offset is not committed."""


class StackError(EoguardError):
    """The local stack could not start a service; the message names its log file."""


class DemoError(EoguardError):
    """``eoguard demo`` could not run: a worker process crashed or a topic was not created."""
