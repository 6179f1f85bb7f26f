"""The GuardedConsumer: expiry, Redis claims, handlers, done marks, then offset commits.

Nothing here imports :mod:`eoguard.producer`; the two subsystems share only the layers below.
The modules use one set of verbs:

- Redis: a *pass* (a batch, or a retry round of it) *claims* its messages under a token of its
  own; its *done* marks settle every claim it made: the handled ones done, the others *let go*
  (failed, refused, expired, dropped); *give back* ends a pass's lease now; *hold* and *drop*
  start and stop the renewal of a pass's lease (:mod:`eoguard.consumer.leases`).
- Local bookkeeping: a batch is *decoded*, *claimed*, *handled*, *committed*
  (:class:`~eoguard.consumer.state.BatchStage`); records of partitions taken away are
  *dropped* from the batches that hold them; a batch whose round trip cannot land is
  *forgotten*; after a failure every batch is *abandoned*.
- Kafka: a *rewind* seeks partitions back to the first offset held, so what was abandoned is
  read again (:mod:`eoguard.consumer.rewind`); offsets are *stored* and *committed* in
  consume order.
"""

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext, RedisTx
from eoguard.consumer.state import ConsumerStats

__all__ = ["ConsumerStats", "GuardedConsumer", "HandlerContext", "RedisTx"]
