"""The claim pass on the executors: one Spark partition's rows claimed against Redis.

Plain Python over Arrow arrays (no pyspark): :mod:`eoguard_spark.dedup` wraps
:func:`claim_partition` in an Arrow UDF. Every task of a micro-batch claims under the batch's
token (:func:`eoguard_spark.dedup.batch_token`) at the row's position, so which copy of an id
wins is decided by Redis, and a retried task or a replay re-owns the copy its earlier attempt
claimed however Spark partitions it. A partition claims only rows that reach the sinks: a
claim it lets go is released at once.

Every attempt of a task must reach the same outcome for each row, since the driver's done mark
covers every claim naming the token whichever attempt's output Spark commits. A claim is
stable once made (a later attempt finds it MINE), and so are DONE, DUPLICATE and EXPIRED; BUSY
is not (its holder may release it). So the last claim of a BUSY row gives it up for good under
the token (``give_up_busy``): every later attempt finds it PASSED and leaves it out too, and an
attempt that took it over first is found by the giving-up claim instead (MINE: kept).

What each outcome means for a row, the replay rules and the bound on BUSY waits are the
policy the job shares with the GuardedConsumer (:mod:`eoguard.store.claim_policy`); this module
turns its verdicts into row statuses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from eoguard.backoff import jittered
from eoguard.store.claim_policy import BusyWait, ClaimPolicy, Verdict, spark_policy
from eoguard.store.client import RedisClient
from eoguard.store.dedup import Claim, ClaimReport, ClaimResult
from eoguard_spark.decode import RowStatus
from eoguard_spark.worker import IN_FLIGHT, ClaimSettings, freeze_loaded_objects, in_flight

__all__ = ["ClaimInput", "claim_partition"]

ClaimInput = tuple[pa.Array, pa.Array, pa.Array, pa.Array, pa.Array]
"""One input batch's columns: id, position, expires_at_ms, status, and the id's shard
(:func:`eoguard_spark.dedup.shard_column`: Spark computes it, so no per-row hash here)."""

_HANDLED_AS = {  # a handled row's status says which claim made it this batch's
    ClaimResult.NEW: RowStatus.NEW.value,
    ClaimResult.MINE: RowStatus.MINE.value,
    ClaimResult.DONE_HERE: RowStatus.DONE_HERE.value,  # a replay of a done batch
}
_STATUS_OF = {  # every other verdict's row status
    Verdict.WAIT: RowStatus.BUSY.value,
    Verdict.DUPLICATE: RowStatus.DUPLICATE.value,
    Verdict.EXPIRED: RowStatus.EXPIRED.value,
    Verdict.RELEASE: RowStatus.STALE.value,  # released: the row is left out
    Verdict.STALE: RowStatus.STALE.value,
    Verdict.PASSED: RowStatus.BUSY.value,  # given up as BUSY by an attempt of this task
}
_OK, _NEW, _BUSY = RowStatus.OK.value, RowStatus.NEW.value, RowStatus.BUSY.value
_DUPLICATE = RowStatus.DUPLICATE.value
_HANDLE, _WAIT, _RELEASE = Verdict.HANDLE, Verdict.WAIT, Verdict.RELEASE
_BUSY_POLL_S = 0.5  # how often a BUSY claim is retried: the other holder may finish any time


class _Partition:
    """The claims of one Spark partition: its store, and the ids it won so far."""

    def __init__(self, settings: ClaimSettings, client: RedisClient,
                 pool: ThreadPoolExecutor) -> None:
        self.settings = settings
        self.token = settings.token
        self.client = client
        self.store = settings.store(client)
        self.pool = pool  # round trips in flight on a cluster (see worker.in_flight)
        self.won: set[str] = set()  # a later copy of one of these is a duplicate
        self.policy: ClaimPolicy = spark_policy(replay=settings.token_done)

    def claim_batch(self, arrays: ClaimInput) -> pa.Array:
        """The status column of one input batch after claiming its ``ok`` rows."""
        id_array, position_array, expires_array, status_array, shard_array = arrays
        status: list[str] = status_array.to_pylist()
        todo = [i for i, row_status in enumerate(status) if row_status == _OK]
        if todo:
            self.claim_rows(status, todo, id_array.to_pylist(), position_array.to_pylist(),
                            expires_array.to_pylist(), shard_array.to_pylist())
        return pa.array(status, pa.string())

    def claim_rows(self, status: list[str], todo: list[int], ids: list[str],  # noqa: PLR0917
                   positions: list[str], expires: list[int], shards: list[int]) -> None:
        """Set ``status[i]`` of the rows ``todo`` (all ``ok``) to their claim's outcome.

        Step 1. A copy of an id this partition won already is a duplicate, with no claim.
        Step 2. Claim the rest under the batch's token, ``batch_size`` per round trip.
        Step 3. Sort the results (:meth:`_sort_claims`): a BUSY claim held by this batch's token
                (a copy of the id elsewhere in the batch) is a duplicate.
        Step 4. Other BUSY claims are claimed again until ``busy_wait_ms`` (none in the
                first pass, see :func:`eoguard_spark.dedup.settle_busy`); with
                ``give_up_busy``, those still BUSY then are given up for good (see above).
        """
        won = self.won
        rows: list[int] = []
        for i in todo:  # Step 1.
            if ids[i] in won:
                status[i] = _DUPLICATE
            else:
                rows.append(i)
        claims = self.store.located_claims([ids[i] for i in rows], [positions[i] for i in rows],
                                           [expires[i] for i in rows], [shards[i] for i in rows])
        report = self._claim_round(claims)  # Step 2.
        results = report.results
        if not self.settings.token_done and results.count(ClaimResult.NEW) == len(results):
            won.update(claim.message_id for claim in claims)  # the common case: all new
            for i in rows:
                status[i] = _NEW
            return
        settled, busy = self._sort_claims(claims, report)  # Step 3.
        for i, row_status in zip(rows, settled, strict=True):
            status[i] = row_status
        if busy and (self.settings.busy_wait_ms > 0 or self.settings.give_up_busy):  # Step 4.
            waited = self._wait_on_busy([claims[j] for j in busy],
                                        [report.lease_ms[j] for j in busy])
            for j, row_status in zip(busy, waited, strict=True):
                status[rows[j]] = row_status

    def _sort_claims(self, claims: list[Claim], report: ClaimReport
                     ) -> tuple[list[str], list[int]]:
        """The row status of each claim's result, and the indexes of the claims still BUSY.

        The verdicts are :func:`eoguard.store.claim_policy.spark_policy`'s: handled rows
        (NEW and MINE; in a replay of a done batch, ``token_done``, DONE_HERE instead, while a
        NEW claim is released and its row left out as ``stale``) are won; a BUSY claim held by
        this batch's token (another copy of the id in this batch), or of an id this partition
        won, is a duplicate; a PASSED one stays ``busy``.
        """
        won, policy, results = self.won, self.policy, report.results
        verdicts = [policy.verdict(result) for result in results]
        won.update(claim.message_id for claim, verdict in zip(claims, verdicts, strict=True)
                   if verdict is _HANDLE)
        out: list[str] = []
        busy: list[int] = []
        release: list[Claim] = []
        for j, (claim, result, first) in enumerate(zip(claims, results, verdicts, strict=True)):
            verdict = first if first is not _WAIT else policy.verdict(
                result, own_holder=claim.message_id in won or report.holders.get(j) == self.token)
            if verdict is _HANDLE:
                out.append(_HANDLED_AS[result])
                continue
            out.append(_STATUS_OF[verdict])
            if verdict is _RELEASE:
                release.append(claim)
            elif verdict is _WAIT:
                busy.append(j)
        if release:  # claimed, but the row will not reach the sinks: not ours to keep
            self.store.release(self.token, release)
        return out, busy

    def _claim_round(self, claims: list[Claim]) -> ClaimReport:
        """Claim once, ``batch_size`` per round trip (several in flight)."""
        store, size, token = self.store, self.settings.batch_size, self.token
        results: list[ClaimResult] = []
        lease_ms: dict[int, int] = {}
        holders: dict[int, str] = {}
        chunks = (store.prepare_claim(token, claims[start:start + size])
                  for start in range(0, len(claims), size))
        for report in in_flight(store, chunks, "claiming a batch", self.pool):
            lease_ms.update((len(results) + j, left) for j, left in report.lease_ms.items())
            holders.update((len(results) + j, holder) for j, holder in report.holders.items())
            results += report.results
        return ClaimReport(results, lease_ms, holders)

    def _wait_on_busy(self, claims: list[Claim], lease_left_ms: list[int]) -> list[str]:
        """Claim BUSY claims again until ``busy_wait_ms`` has passed; the status of each.

        One taken over once the holder's lease lapsed is ``new``, one its holder finished a
        ``duplicate``. With ``give_up_busy`` (the settling pass) the last claim, at the
        deadline, gives up those still BUSY for good (``busy``: skipped, its holder handles
        it), so no later attempt of this task takes one; without it (a first pass, settled by
        another) they stay ``busy``. The bound: :class:`eoguard.store.claim_policy.BusyWait`.
        """
        out = [_BUSY] * len(claims)
        wait = BusyWait.starting_now(self.settings.busy_wait_ms / 1000)
        pending = list(range(len(claims)))
        settling = self.settings.give_up_busy
        while pending:
            if not wait.over():
                time.sleep(wait.next_s(jittered(_BUSY_POLL_S), lease_left_ms))
            elif not settling:
                break
            last = self.policy.gives_up(settling, wait)
            chunk = [claims[i] for i in pending]
            report = self.store.run([self.store.prepare_claim(self.token, chunk,
                                                              give_up_busy=last)],
                                    "claiming busy rows")[0]
            settled, still = self._sort_claims(chunk, report)
            for i, row_status in zip(pending, settled, strict=True):
                out[i] = row_status
            if last:
                break
            lease_left_ms = [report.lease_ms[j] for j in still]
            pending = [pending[j] for j in still]
        return out


def claim_partition(settings: ClaimSettings, batches: Iterator[ClaimInput]
                    ) -> Iterator[pa.Array]:
    """The status of each row after claiming, one Arrow array per input batch.

    Rows with status ``ok`` are claimed under ``settings.token`` and get the claim's outcome
    (``new``, ``mine``, ``done_here``, ``duplicate``, ``busy``, ``expired``, ``stale``); other
    rows keep their status.
    """
    if not settings.token:
        raise ValueError("a claim pass needs its micro-batch's token (ClaimSettings.token)")
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
