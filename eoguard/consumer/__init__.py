"""The GuardedConsumer: expiry, Redis claims, handlers, done marks, then offset commits.

Nothing here imports :mod:`eoguard.producer`; the two subsystems share only the layers below.
A claim's life has one set of verbs, the same in the store, the Spark job and docs/design.md:

- *claim*: a *pass* (a batch, or a retry round of it) claims its messages under a token of its
  own. A claim at the pass's own position is *re-owned* (MINE); one under a lapsed lease is
  *taken over* (NEW). What each outcome means for the pass, for a consumer and for the Spark
  job, is one policy: :mod:`eoguard.store.claim_policy`.
- *handle*: the handler runs on what the pass claimed.
- *mark done*: the pass's done marks make its handled claims done (their effects applied)
  and *release* the others (failed, refused, expired, dropped): a released claim is deleted
  while it still names the token. Past ``max_retries`` a message is *dead-lettered*.
- *give up*: the Spark job only: a claim still BUSY when its settling pass stops waiting is
  given up for good under the token (PASSED); a consumer never gives a claim up, it skips it.
- *give back*: a pass's lease ends now, so its open claims are free to take over; *hold* and
  *drop* start and stop the renewal of a pass's lease (:mod:`eoguard.consumer.leases`).
- Local bookkeeping: a batch is *decoded*, *claimed*, *handled*, *committed*
  (:class:`~eoguard.consumer.state.BatchStage`); records of partitions taken away are
  *dropped* from the batches that hold them; a batch whose round trip cannot land is
  *forgotten*; after a failure every batch is *abandoned*.
- Kafka: a *rewind* seeks partitions back to the first offset held, so what was abandoned is
  read again (:mod:`eoguard.consumer.rewind`); offsets are *stored* and *committed* in
  consume order.
"""

from eoguard.consumer.aio import AsyncGuardedConsumer
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext, RedisTx
from eoguard.consumer.state import ConsumerStats
from eoguard.consumer.trace import TraceRecord

__all__ = ["AsyncGuardedConsumer", "ConsumerStats", "GuardedConsumer", "HandlerContext", "RedisTx",
           "TraceRecord"]
