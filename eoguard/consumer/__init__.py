"""The GuardedConsumer: expiry, Redis claims, handlers, done marks, then offset commits.

Nothing here imports :mod:`eoguard.producer`; the two subsystems share only the layers below.
"""

from eoguard.consumer.batch import ConsumerStats
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext, RedisTx

__all__ = ["ConsumerStats", "GuardedConsumer", "HandlerContext", "RedisTx"]
