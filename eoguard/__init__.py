"""eoguard: delivery guarantees for Apache Kafka (outbox, dedup, expiry).

This module holds the public API only; everything listed in ``__all__`` is stable.
"""

from eoguard.codec import EnvelopeCodec, PayloadCodec, SchemaRegistry
from eoguard.config import (
    ConsumerConfig,
    KeepUntil,
    PersistenceMode,
    ProducerConfig,
    RedisConfig,
)
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
    DemoError,
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
from eoguard.guard.batch import ConsumerStats
from eoguard.guard.consumer import GuardedConsumer
from eoguard.guard.handler import HandlerContext, RedisTx
from eoguard.guard.messages import MessageState, ProducerStats, SendHandle
from eoguard.guard.producer import GuardedProducer
from eoguard.guard.recovery import RecoveryReport
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
    "ConsumerConfig",
    "ConsumerError",
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
    "InvalidMessageError",
    "KeepUntil",
    "MessageState",
    "MessageTooLargeError",
    "PayloadCodec",
    "PayloadEncodeError",
    "PersistError",
    "PersistenceMode",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerError",
    "ProducerStats",
    "RecoveryReport",
    "RedisConfig",
    "RedisTx",
    "SchemaNotFoundError",
    "SchemaRegistry",
    "SendHandle",
    "StackError",
    "StoreError",
    "StoreUnavailableError",
    "UnknownFingerprintError",
    "derived_message_id",
    "new_message_id",
    "now_ms",
]
