"""Keeps the leases of the consumer's open batches alive (docs/design.md §4, §6).

A batch's claims share one lease per shard, held by its batch records: the claim script sets
the deadline, and :class:`BatchLeases` moves every open record's deadline every ``lease_s /
3`` from a thread of its own, in one script call (one write per record), so a slow handler, a
long batch handler, retries with backoff, and the batches read ahead behind them keep their
claims. The consumer tells it which batches it holds (:meth:`hold`, when their claims are
sent) and which it no longer holds (:meth:`drop`, when their done marks are sent, or when it
forgets them). A renewal that reaches a record after its done mark finds it DONE and writes
nothing; one that runs before the claim call that creates the record finds nothing and
writes nothing.

Renewal stops after ``max_hold_s`` (the consumer's ``max.poll.interval.ms``): a handler hung
that long has lost its partitions to the group, and its claims must lapse so the record's new
reader, or a duplicate elsewhere, can take them over instead of waiting on them as BUSY.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from eoguard.errors import StoreError
from eoguard.store.dedup import DedupStore, RecordKey

log = logging.getLogger(__name__)


class BatchLeases:
    """Renews the batch records of one consumer every ``interval_s`` until closed."""

    def __init__(self, dedup: DedupStore, *, interval_s: float, max_hold_s: float,
                 name: str = "eoguard-lease") -> None:
        self._dedup = dedup
        self._interval_s = interval_s
        self._max_hold_s = max_hold_s
        self._held: dict[str, tuple[list[RecordKey], float]] = {}  # token -> records, since
        self._lock = threading.Lock()  # held while a renewal is in flight: drop() waits for it
        self._stop = threading.Event()
        self.renewals = 0  # renewal passes sent
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def hold(self, token: str, records: Sequence[RecordKey]) -> None:
        """Renew the records of the claim pass ``token`` from now on."""
        with self._lock:
            self._held[token] = (list(records), time.monotonic())

    def holds(self, token: str) -> bool:
        """Whether the claim pass ``token`` is this consumer's and not done yet."""
        return token in self._held  # a dict lookup: atomic, no lock needed

    def drop(self, *tokens: str) -> None:
        """Stop renewing these batches; returns once no renewal of them can still be sent."""
        with self._lock:
            for token in tokens:
                self._held.pop(token, None)

    def drop_all(self) -> None:
        with self._lock:
            self._held.clear()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def renew(self) -> None:
        """Renew every held batch now, in one round trip; the thread calls it on its schedule."""
        with self._lock:
            stale = time.monotonic() - self._max_hold_s
            expired = [token for token, (_, since) in self._held.items() if since <= stale]
            if expired:
                log.warning("%d batches held past max.poll.interval.ms (a stalled handler): "
                            "no longer renewed", len(expired))
                for token in expired:
                    del self._held[token]
            records = [record for held, _ in self._held.values() for record in held]
            if not records:
                return
            self.renewals += 1
            self._dedup.renew(records)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.renew()
            except StoreError as exc:  # the leases may lapse: the done marks then say so
                log.warning("renewing %d batches failed: %s", self.held(), exc)
