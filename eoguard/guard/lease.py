"""Keeps the consumer's claims alive while their batch is handled (DESIGN.md §4, §6).

A claim's lease runs ``lease_s`` from its claim. A batch whose handling takes longer (a slow
handler, a long batch handler, retries with backoff) would let a duplicate elsewhere take its
claims over and handle them a second time. :class:`LeaseKeeper` renews every held claim every
``lease_s / 3`` from a thread of its own, by claiming it again: the claim script answers MINE
and moves the deadline. The consumer tells it what it holds (:meth:`hold`) and what it no
longer holds (:meth:`drop`, before a done mark or a release): a renewal is then never sent
for a claim given back. One landing after a done mark finds DONE and writes nothing.

Renewal stops after ``max_hold_s`` (the consumer's ``max.poll.interval.ms``): a handler hung
that long has lost its partitions to the group, and its claims must lapse so the record's new
reader, or a duplicate elsewhere, can take them over instead of skipping them as BUSY.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from eoguard.errors import StoreError
from eoguard.store.dedup import Claim, ClaimResult, DedupStore

log = logging.getLogger(__name__)

_KEPT = (ClaimResult.NEW, ClaimResult.MINE, ClaimResult.TAKEN_OVER)


class LeaseKeeper:
    """Renews the held claims of one consumer every ``interval_s`` until closed."""

    def __init__(self, dedup: DedupStore, *, interval_s: float, max_hold_s: float,
                 name: str = "eoguard-lease") -> None:
        self._dedup = dedup
        self._interval_s = interval_s
        self._max_hold_s = max_hold_s
        # by owner token (one record, one claim): the claim, and when it was first held (two
        # dicts, no (claim, time) pair: thousands of those in flight cost the cyclic GC walks)
        self._held: dict[str, Claim] = {}
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()  # held while a renewal is in flight: drop() waits for it
        self._stop = threading.Event()
        self.renewals = 0  # round trips sent
        self.lost = 0  # claims found held by another owner at renewal (their lease had lapsed)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def hold(self, claims: Iterable[Claim]) -> None:
        now = time.monotonic()
        with self._lock:
            held, since = self._held, self._since
            for claim in claims:
                owner = claim.owner
                if owner not in held:
                    held[owner] = claim
                    since[owner] = now

    def drop(self, claims: Iterable[Claim]) -> None:
        """Stop renewing ``claims``; returns once no renewal of them can still be sent."""
        with self._lock:
            held, since = self._held, self._since
            for claim in claims:
                if held.pop(claim.owner, None) is not None:
                    del since[claim.owner]

    def drop_all(self) -> None:
        with self._lock:
            self._held.clear()
            self._since.clear()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def renew(self) -> None:
        """Renew every held claim now (one round trip); the thread calls it on its schedule."""
        with self._lock:
            stale = time.monotonic() - self._max_hold_s
            since = self._since
            claims = [claim for owner, claim in self._held.items() if since[owner] > stale]
            if len(claims) < len(self._held):
                log.warning("%d claims held past max.poll.interval.ms (a stalled handler): no "
                            "longer renewed", len(self._held) - len(claims))
                self._held = {claim.owner: claim for claim in claims}
                self._since = {claim.owner: since[claim.owner] for claim in claims}
            if not claims:
                return
            self.renewals += 1
            results = self._dedup.claim(claims)
            for claim, result, _ in results:
                if result not in _KEPT:  # BUSY: lapsed and taken; DONE/EXPIRED: settled
                    if self._held.pop(claim.owner, None) is not None:
                        del self._since[claim.owner]
                    if result is ClaimResult.BUSY:
                        self.lost += 1
                        log.warning("claim on %s lapsed and was taken over before renewal; "
                                    "its done mark will be refused", claim.message_id)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.renew()
            except StoreError as exc:  # the claims may lapse: done marks then say so
                log.warning("renewing %d claims failed: %s", self.held(), exc)
