"""eoguard: delivery guarantees for Apache Kafka (outbox, dedup, expiry).

This module holds the public API only; everything listed in ``__all__`` is stable.
"""

from eoguard.codec import EnvelopeCodec, InputLimits, PayloadCodec, SchemaRegistry
from eoguard.config import ConsumerConfig, ProducerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext, RedisTx
from eoguard.consumer.state import ConsumerStats
from eoguard.envelope import (
    Envelope,
    canonical_id,
    derived_message_id,
    message_id_for,
    new_message_id,
    now_ms,
)
from eoguard.errors import (
    BackpressureError,
    BadMagicError,
    BrokerError,
    BrokerUnavailableError,
    ClaimNotOwnedError,
    CodecError,
    ConfigError,
    ConsumerClosedError,
    CorruptRecordError,
    DeadLetterError,
    DemoError,
    EoguardError,
    InvalidEnvelopeError,
    InvalidInputError,
    InvalidMessageError,
    KafkaFatalError,
    MessageTooLargeError,
    PayloadEncodeError,
    PersistError,
    ProducerClosedError,
    ReplicationTimeoutError,
    SchemaNotFoundError,
    StackError,
    StateError,
    StoreError,
    StoreOutOfMemoryError,
    StoreUnavailableError,
    UnavailableError,
    UnknownFingerprintError,
)
from eoguard.modes import KeepUntil, PersistenceMode
from eoguard.producer.guarded import GuardedProducer
from eoguard.producer.messages import MessageState, ProducerStats, SendHandle
from eoguard.producer.recovery import RecoveryReport
from eoguard.store.dedup import ClaimResult, DedupStore

__all__ = [
    "BackpressureError",
    "BadMagicError",
    "BrokerError",
    "BrokerUnavailableError",
    "ClaimNotOwnedError",
    "ClaimResult",
    "CodecError",
    "ConfigError",
    "ConsumerClosedError",
    "ConsumerConfig",
    "ConsumerStats",
    "CorruptRecordError",
    "DeadLetterError",
    "DedupStore",
    "DemoError",
    "Envelope",
    "EnvelopeCodec",
    "EoguardError",
    "GuardedConsumer",
    "GuardedProducer",
    "HandlerContext",
    "InputLimits",
    "InvalidEnvelopeError",
    "InvalidInputError",
    "InvalidMessageError",
    "KafkaFatalError",
    "KeepUntil",
    "MessageState",
    "MessageTooLargeError",
    "PayloadCodec",
    "PayloadEncodeError",
    "PersistError",
    "PersistenceMode",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerStats",
    "RecoveryReport",
    "RedisConfig",
    "RedisTx",
    "ReplicationTimeoutError",
    "SchemaNotFoundError",
    "SchemaRegistry",
    "SendHandle",
    "StackError",
    "StateError",
    "StoreError",
    "StoreOutOfMemoryError",
    "StoreUnavailableError",
    "UnavailableError",
    "UnknownFingerprintError",
    "canonical_id",
    "derived_message_id",
    "message_id_for",
    "new_message_id",
    "now_ms",
]
