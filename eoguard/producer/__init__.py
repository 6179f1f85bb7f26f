"""The GuardedProducer and its asyncio front: Redis outbox, guaranteed callbacks, adaptive
delay and recovery.

Nothing here imports :mod:`eoguard.consumer`; the two subsystems share only the layers below.
"""

from eoguard.producer.aio import AsyncGuardedProducer
from eoguard.producer.guarded import GuardedProducer
from eoguard.producer.messages import MessageState, ProducerStats, SendHandle
from eoguard.producer.recovery import RecoveryReport

__all__ = ["AsyncGuardedProducer", "GuardedProducer", "MessageState", "ProducerStats",
           "RecoveryReport", "SendHandle"]
