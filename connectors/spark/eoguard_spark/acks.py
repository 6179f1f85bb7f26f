"""The senders' outbox acknowledgement of committed micro-batches, in the background.

A batch's acknowledgement pass reads its committed Parquet files back and acknowledges
their ids on the executors: a Spark job of its own (0.3-0.4 s a batch of 50,000 on two
cores, half of it the job's fixed cost). It comes after the batch's done mark and needs
nothing else of the batch, and nothing of the batch waits for it. So :class:`AckQueue` runs
it on a driver thread while the next micro-batch runs: one pass at a time, in batch order,
each batch's pass waiting for the one before.

A crash can cut a pass short after Spark committed its batch, so no replay runs it again.
The records it left stay in the outbox until their TTL ends them at expiry, and they are
never resent: they are in Kafka, which the producer knows. The job's first micro-batch after
a start acknowledges the batch before it once more (see ``BatchProcessor``); acknowledging a
record twice is harmless. A pass that fails is raised again in the next batch, which fails
the query, as an inline pass would have.

:func:`wait_for_acks` waits for a query's last pass: ``eoguard_spark.run`` calls it once the
query ends, and so should a caller of ``build_query`` that stops its session right after.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["AckQueue", "wait_for_acks"]

log = logging.getLogger(__name__)

_queues: dict[str, AckQueue] = {}  # by query id (the checkpoint's): what wait_for_acks finds
_queues_lock = threading.Lock()


class AckQueue:
    """Acknowledgement passes of one query, one at a time on a thread of their own."""

    def __init__(self, query_id: str) -> None:
        self.query_id = query_id
        # The pool's thread is joined at interpreter exit: a pass in flight then finishes.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eoguard-ack")
        self._last: tuple[int, Future[int]] | None = None
        with _queues_lock:
            _queues[query_id] = self

    def submit(self, batch_id: int, ack: Callable[[], int]) -> None:
        """Run ``ack`` (batch ``batch_id``'s pass, returning how many records it
        acknowledged) once the pass before it has ended; raises that pass's error."""
        self.wait()
        self._last = (batch_id, self._pool.submit(ack))

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the pass in flight: how many records it acknowledged (None if none was in
        flight). Its error is raised here, once."""
        if self._last is None:
            return None
        batch_id, future = self._last
        try:
            acked = future.result(timeout)
        except TimeoutError:
            raise
        except BaseException:
            self._last = None
            log.error("the outbox acknowledgement of batch %d failed", batch_id)
            raise
        self._last = None
        log.info("eoguard batch %d: %d outbox records acknowledged", batch_id, acked)
        return acked


def wait_for_acks(query: StreamingQuery, timeout: float | None = None) -> int | None:
    """Wait for the acknowledgement pass ``query``'s job has in flight (see the module
    docstring): how many records it acknowledged, None if none was in flight."""
    with _queues_lock:
        queue = _queues.get(str(query.id))
    return None if queue is None else queue.wait(timeout)
