"""The driver keeps a running micro-batch's claims alive: its batch records renewed every
``lease/3`` from a background thread, so a batch slower than ``lease_s`` loses no claim.

The lease of a claim pass is its batch records' (``o|deadline``, one per shard, written by the
executors' claim calls); :meth:`eoguard.store.dedup.DedupStore.renew` moves the deadline of the
open ones and leaves done and absent ones alone, so renewing every shard of the token from the
first moment of the batch to its done mark is safe whatever the executors claimed so far.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from eoguard.store.dedup import DedupStore, RenewResult

__all__ = ["BatchLease"]

log = logging.getLogger(__name__)


class BatchLease:
    """A context manager: renews the batch records of ``token`` until the block ends.

    A failed renewal is logged and tried again at the next tick (the claims are lost only if
    every renewal fails for a whole lease); ``renewals`` counts the calls that reached Redis.
    """

    def __init__(self, store: DedupStore, token: str, *, lease_ms: int,
                 every_s: float | None = None) -> None:
        self.store = store
        self.token = token
        self.lease_ms = lease_ms
        self.every_s = every_s if every_s is not None else lease_ms / 3000
        self.renewals = 0
        self.renewed = 0  # open records moved, over all renewals
        self._records = store.batch_keys(token)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"eoguard-lease-{token}",
                                        daemon=True)

    def __enter__(self) -> BatchLease:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def renew_now(self) -> None:
        """One renewal of every open batch record of the token."""
        results = self.store.renew(self._records, self.lease_ms)
        self.renewals += 1
        self.renewed += results.count(RenewResult.RENEWED)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.renew_now()
            except Exception:  # a Redis hiccup must not end the batch; the next tick retries
                log.warning("renewing the lease of batch %s failed; retrying in %.1f s",
                            self.token, self.every_s, exc_info=True)
