"""The claim pass on the executors: one Spark partition's rows claimed against Redis.

Plain Python over Arrow arrays (no pyspark): :mod:`eoguard_spark.dedup` wraps
:func:`claim_partition` in an Arrow UDF. Which copy of an id wins is decided by Redis, so a
replay re-owns the copy its earlier attempt claimed however Spark partitions it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import redis

from eoguard.store.dedup import Claim, ClaimResult, DedupState, read_entries
from eoguard_spark.decode import RowStatus
from eoguard_spark.worker import IN_FLIGHT, ClaimSettings, freeze_loaded_objects, in_flight

__all__ = ["ClaimInput", "claim_partition"]

ClaimInput = tuple[pa.Array, pa.Array, pa.Array, pa.Array]  # id, owner, expires_at_ms, status

_STATUS_OF = {
    ClaimResult.NEW: RowStatus.NEW.value,
    ClaimResult.MINE: RowStatus.MINE.value,
    ClaimResult.TAKEN_OVER: RowStatus.TAKEN_OVER.value,
    ClaimResult.DONE: RowStatus.DUPLICATE.value,
    ClaimResult.REDELIVERED: RowStatus.DUPLICATE.value,  # in a sink committed before the replay
    ClaimResult.BUSY: RowStatus.BUSY.value,
    ClaimResult.EXPIRED: RowStatus.EXPIRED.value,
    # done by another reader whose effects half applied: done for the job (it passes no
    # effects, so never PARTIAL of its own)
    ClaimResult.PARTIAL: RowStatus.DUPLICATE.value,
}
_OK, _NEW, _BUSY = RowStatus.OK.value, RowStatus.NEW.value, RowStatus.BUSY.value
_DUPLICATE = RowStatus.DUPLICATE.value
_HANDLED = frozenset(r for r in ClaimResult if r.should_handle)
_BUSY_POLL_S = 0.5  # how often a BUSY claim is retried: the other owner may finish any time


def _reader_of(owner: str) -> str:
    """``scope|reader`` of an owner token (topics hold no ``|``: it parses from the right)."""
    return owner.rsplit("|", 3)[0]


class _Partition:
    """The claims of one Spark partition: its store, and the ids it won so far."""

    def __init__(self, settings: ClaimSettings, client: redis.Redis[bytes],
                 pool: ThreadPoolExecutor) -> None:
        self.settings = settings
        self.client = client
        self.store = settings.store(client)
        self.pool = pool  # round trips in flight
        self.won: set[str] = set()  # a later copy of one of these is a duplicate

    def claim_batch(self, arrays: ClaimInput) -> pa.Array:
        """The status column of one input batch after claiming its ``ok`` rows."""
        id_array, owner_array, expires_array, status_array = arrays
        status: list[str] = status_array.to_pylist()
        todo = [i for i, row_status in enumerate(status) if row_status == _OK]
        if todo:
            self.claim_rows(status, todo, id_array.to_pylist(), owner_array.to_pylist(),
                            expires_array.to_pylist())
        return pa.array(status, pa.string())

    def claim_rows(self, status: list[str], todo: list[int], ids: list[str],
                   owners: list[str], expires: list[int]) -> None:
        """Set ``status[i]`` of the rows ``todo`` (all ``ok``) to their claim's outcome.

        Step 1. A copy of an id this partition won already is a duplicate, with no claim.
        Step 2. Claim the rest, ``batch_size`` per round trip.
        Step 3. A claim held by another owner (BUSY) whose holder is this query (the same
                ``scope|reader``: a copy of the id elsewhere in this batch) or that is done by
                now is a duplicate: the holder's copy is the one handled. One GET per such
                claim, pipelined; no wait.
        Step 4. Other BUSY claims are claimed again until ``busy_wait_ms`` (none in the
                first pass, see :func:`eoguard_spark.dedup.resolve_busy`), else stay busy.
        """
        won, store = self.won, self.store
        claims: list[Claim] = []
        rows: list[int] = []
        for i in todo:  # Step 1.
            if ids[i] in won:
                status[i] = _DUPLICATE
            else:
                claims.append(store.new_claim(ids[i], owners[i], expires[i]))
                rows.append(i)
        results, lease_ms = self._claim_round(claims)  # Step 2.
        if results.count(ClaimResult.NEW) == len(results):  # the common case: all new
            won.update(claim.message_id for claim in claims)
            for i in rows:
                status[i] = _NEW
            return
        won.update(claim.message_id for claim, result in zip(claims, results, strict=True)
                   if result in _HANDLED)
        busy: list[int] = []
        for j, (i, result) in enumerate(zip(rows, results, strict=True)):
            if result is not ClaimResult.BUSY:
                status[i] = _STATUS_OF[result]
            elif claims[j].message_id in won:
                status[i] = _DUPLICATE
            else:
                status[i] = _BUSY
                busy.append(j)
        if busy:
            self._settle_busy(status, [claims[j] for j in busy], [rows[j] for j in busy],
                              [lease_ms[j] for j in busy])

    def _settle_busy(self, status: list[str], claims: list[Claim], at: list[int],
                     lease_ms: list[int]) -> None:
        """Steps 3 and 4 of :meth:`claim_rows` for the BUSY ``claims`` of rows ``at``."""
        here = self._held_here(claims)  # Step 3.
        for i, held_here in zip(at, here, strict=True):
            if held_here:
                status[i] = _DUPLICATE
        waiting = [j for j, held_here in enumerate(here) if not held_here]
        if waiting and self.settings.busy_wait_ms > 0:  # Step 4.
            waited = self._wait_on_busy([claims[j] for j in waiting],
                                        [lease_ms[j] for j in waiting])
            for j, outcome in zip(waiting, waited, strict=True):
                status[at[j]] = outcome

    def _claim_round(self, claims: list[Claim]) -> tuple[list[ClaimResult], dict[int, int]]:
        """Claim once, ``batch_size`` per round trip: the results, and the lease left (ms) of
        each BUSY claim by its index."""
        store, size = self.store, self.settings.batch_size
        results: list[ClaimResult] = []
        lease_ms: dict[int, int] = {}
        chunks = (store.prepare_claim(claims[start:start + size])
                  for start in range(0, len(claims), size))
        for report in in_flight(store, chunks, "claiming a batch", self.pool):
            lease_ms.update((len(results) + j, left) for j, left in report.lease_ms.items())
            results += report.results
        return results, lease_ms

    def _held_here(self, claims: list[Claim]) -> list[bool]:
        """Per BUSY claim: is its holder this query (same ``scope|reader``), or is it done?"""
        out: list[bool] = []
        keys, size = self.store.keys, self.settings.batch_size
        for start in range(0, len(claims), size):
            chunk = claims[start:start + size]
            entries = {e.key: e for e in read_entries(self.client, keys, [c.key for c in chunk])}
            for claim in chunk:
                entry = entries.get(claim.key)
                out.append(entry is not None and (
                    entry.state is not DedupState.CLAIMED  # done (or done, partially)
                    or _reader_of(entry.owner) == _reader_of(claim.owner)))
        return out

    def _wait_on_busy(self, claims: list[Claim], lease_left_ms: list[int]) -> list[str]:
        """Claim BUSY claims again until ``busy_wait_ms`` has passed; the status of each.

        A claim still BUSY at the deadline stays ``busy``; one whose id this partition has
        won meanwhile is a duplicate.
        """
        out = [_BUSY] * len(claims)
        deadline = time.monotonic() + self.settings.busy_wait_ms / 1000
        pending = list(range(len(claims)))
        while pending:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break
            time.sleep(min(left_s, _BUSY_POLL_S, min(lease_left_ms) / 1000 + 0.01))
            outcomes = self.store.claim([claims[i] for i in pending])
            still: list[int] = []
            lease_left_ms = []
            for i, outcome in zip(pending, outcomes, strict=True):
                if outcome.result is ClaimResult.BUSY:
                    still.append(i)
                    lease_left_ms.append(outcome.lease_ms)
                else:
                    out[i] = _STATUS_OF[outcome.result]
                    if outcome.result.should_handle:
                        self.won.add(claims[i].message_id)
            for i in still:
                if claims[i].message_id in self.won:
                    out[i] = _DUPLICATE
            pending = [i for i in still if claims[i].message_id not in self.won]
        return out


def claim_partition(settings: ClaimSettings, batches: Iterator[ClaimInput]
                    ) -> Iterator[pa.Array]:
    """The status of each row after claiming, one Arrow array per input batch.

    Rows with status ``ok`` are claimed and get the claim's outcome (``new``, ``mine``,
    ``taken_over``, ``duplicate``, ``busy``, ``expired``); other rows keep their status.
    """
    freeze_loaded_objects()
    client = settings.connect()
    pool = ThreadPoolExecutor(IN_FLIGHT, "eoguard-redis")
    try:
        partition = _Partition(settings, client, pool)
        # Batch k is claimed on a helper thread while this one reads batch k+1, which Spark
        # decodes meanwhile; one helper, so batches are claimed in order.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eoguard-claims") as helper:
            previous: Future[pa.Array] | None = None
            for arrays in batches:
                current = helper.submit(partition.claim_batch, arrays)
                if previous is not None:
                    yield previous.result()
                previous = current
            if previous is not None:
                yield previous.result()
    finally:
        pool.shutdown()
        client.close()
