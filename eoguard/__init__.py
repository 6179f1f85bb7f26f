"""eoguard: delivery guarantees for Apache Kafka (outbox, dedup, expiry).

This module holds the public API only; everything listed in ``__all__`` is stable.
"""

from eoguard.codec import EnvelopeCodec, PayloadCodec, SchemaRegistry
from eoguard.envelope import Envelope, derived_message_id, new_message_id, now_ms
from eoguard.errors import (
    BackpressureError,
    BadMagicError,
    BrokerError,
    BrokerUnavailableError,
    ClaimNotOwnedError,
    CodecError,
    ConfigError,
    ConsumerError,
    CorruptRecordError,
    DeadLetterError,
    EoguardError,
    InvalidMessageError,
    MessageTooLargeError,
    PayloadEncodeError,
    PersistError,
    ProducerClosedError,
    ProducerError,
    SchemaNotFoundError,
    StackError,
    StoreError,
    StoreUnavailableError,
    UnknownFingerprintError,
)

__all__ = [
    "BackpressureError",
    "BadMagicError",
    "BrokerError",
    "BrokerUnavailableError",
    "ClaimNotOwnedError",
    "CodecError",
    "ConfigError",
    "ConsumerError",
    "CorruptRecordError",
    "DeadLetterError",
    "Envelope",
    "EnvelopeCodec",
    "EoguardError",
    "InvalidMessageError",
    "MessageTooLargeError",
    "PayloadCodec",
    "PayloadEncodeError",
    "PersistError",
    "ProducerClosedError",
    "ProducerError",
    "SchemaNotFoundError",
    "SchemaRegistry",
    "StackError",
    "StoreError",
    "StoreUnavailableError",
    "UnknownFingerprintError",
    "derived_message_id",
    "new_message_id",
    "now_ms",
]
