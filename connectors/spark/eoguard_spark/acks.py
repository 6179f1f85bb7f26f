"""The senders' outbox acknowledgement of committed micro-batches, in the background.

A batch's acknowledgement pass reads its committed Parquet files back and acknowledges
their ids: on the executors, a Spark job of its own (~0.4 CPU-s a batch of 50,000 on two
cores, ~0.17 of it the fixed cost of any Spark job); on the driver when the files are on its
own filesystem and batches are bounded (~0.1 CPU-s: no Spark job). It comes after the
batch's done mark and needs nothing else of the batch, and nothing of the batch waits for
it. So :class:`AckQueue` runs it on a driver thread while the next micro-batch runs: one
pass at a time, in batch order, each batch's pass waiting for the one before. So when Spark
commits batch N, every pass before N's has ended without an error.

A crash can cut a pass short after Spark committed its batch, so no replay runs it again.
The job's first micro-batch after a start acknowledges the batch before it once more (see
``MicroBatchRunner``; acknowledging a record twice is harmless). Until then the records stay in
the outbox (their TTL ends them at expiry), and nothing resends them: they are in Kafka,
which their producer knows. A pass that fails is logged at once and raised again in the next
batch, which fails the query as an inline pass would have (or by :func:`wait_for_acks`).

:func:`wait_for_acks` waits for a query's last pass: ``eoguard_spark.run`` calls it once the
query ends, and so should a caller of ``build_query`` that stops its session afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["AckQueue", "wait_for_acks"]

log = logging.getLogger(__name__)

_queues: dict[str, AckQueue] = {}  # by query id (the checkpoint's): what wait_for_acks finds
_queues_lock = threading.Lock()


class AckQueue:
    """Acknowledgement passes of one query, one at a time on a thread of their own.

    Registered under ``query_id`` for :func:`wait_for_acks`; a queue registered before under
    the same id (the same checkpoint started again in this process) is closed first.
    """

    def __init__(self, query_id: str) -> None:
        self.query_id = query_id
        # The pool's thread is joined at interpreter exit: a pass in flight then finishes.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eoguard-ack")
        self._last: tuple[int, Future[int]] | None = None
        self._lock = threading.Lock()  # _last: a batch's submit and wait_for_acks may race
        with _queues_lock:
            before = _queues.get(query_id)
            _queues[query_id] = self
        if before is not None:
            before.close()

    def submit(self, batch_id: int, ack: Callable[[], int]) -> None:
        """Run ``ack`` (batch ``batch_id``'s pass, returning how many records it
        acknowledged) once the pass before it has ended; raises that pass's error."""
        self.wait()
        future = self._pool.submit(ack)
        future.add_done_callback(lambda done: _report(batch_id, done))
        with self._lock:
            self._last = (batch_id, future)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the pass in flight: how many records it acknowledged (None if none was in
        flight). Its error is raised here, once; on a timeout it stays in flight."""
        with self._lock:
            last = self._last
        if last is None:
            return None
        future = last[1]
        try:
            return future.result(timeout)
        finally:
            if future.done():  # else timed out, or interrupted: still in flight
                with self._lock:
                    if self._last is last:
                        self._last = None

    def close(self) -> None:
        """Wait for the pass in flight (its error is logged, not raised) and end the thread."""
        with contextlib.suppress(Exception):  # _report logged it when it happened
            self.wait()
        self._pool.shutdown(wait=True)
        with _queues_lock:
            if _queues.get(self.query_id) is self:
                del _queues[self.query_id]


def _report(batch_id: int, done: Future[int]) -> None:
    """Log a pass's end as it happens (a failure too, though it is raised later)."""
    if done.cancelled():
        return
    error = done.exception()
    if error is not None:
        log.error("the outbox acknowledgement of batch %d failed: %s", batch_id, error,
                  exc_info=error)
    else:
        log.info("eoguard batch %d: %d outbox records acknowledged", batch_id, done.result())


def wait_for_acks(query: StreamingQuery, timeout: float | None = None) -> int | None:
    """Wait for the acknowledgement pass ``query``'s job has in flight (see the module
    docstring): how many records it acknowledged, None if none was in flight. Raises the
    pass's error, and ``TimeoutError`` past ``timeout`` seconds (the pass goes on). Once the
    query has stopped, its queue is closed as well."""
    with _queues_lock:
        queue = _queues.get(str(query.id))
    if queue is None:
        return None
    acked = queue.wait(timeout)
    if not query.isActive:
        queue.close()
    return acked
