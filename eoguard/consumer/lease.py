"""Keeps the consumer's claims alive while their batch is handled (DESIGN.md §4, §6).

A claim's lease runs ``lease_s`` from its claim. A batch whose handling takes longer (a slow
handler, a long batch handler, retries with backoff) would let a duplicate elsewhere take its
claims over and handle them a second time. :class:`LeaseKeeper` renews every held claim every
``lease_s / 3`` from a thread of its own, by claiming it again: the claim script answers MINE
and moves the deadline. The consumer tells it what it holds (:meth:`hold`) and what it no
longer holds (:meth:`drop`, before a done mark or a release): a renewal is then never sent
for a claim given back. One landing after a done mark finds DONE and writes nothing.

Claims are held from the moment they are sent (``answered=False``), before their answer is
read: the consumer reads it two polls later, and a claim waiting that long unrenewed would
lapse behind batches that take a third of the lease each. Until their answer is read they are
renewed without being claimed again (:meth:`DedupStore.renew`: only a claim already ours is
extended), since claiming could take a key their answer reports as another owner's, which
nobody would then hold. Nothing is dropped on what that renewal finds (it may run before the
claims themselves, on another connection): the answer, when read, holds what is ours
(``answered=True``) and drops the rest.

Renewal stops after ``max_hold_s`` (the consumer's ``max.poll.interval.ms``): a handler hung
that long has lost its partitions to the group, and its claims must lapse so the record's new
reader, or a duplicate elsewhere, can take them over instead of skipping them as BUSY. It
counts from when the claim's answer is read (right before its batch is handled), not from
when it was sent: batches read ahead wait behind the ones being handled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

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
        self._unanswered: set[str] = set()  # sent, their claim's answer not read yet
        self._lock = threading.Lock()  # held while a renewal is in flight: drop() waits for it
        self._stop = threading.Event()
        self.renewals = 0  # renewal passes
        self.lost = 0  # claims found held by another owner at renewal (their lease had lapsed)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def hold(self, claims: Sequence[Claim], *, answered: bool = True) -> None:
        """Renew ``claims`` from now on: ``answered=False`` when they were just sent (their
        answer, ours or not, is not read yet), True when they are known to be ours.

        A batch at a time, so the set and dict updates run in C (the consumer's hot path)."""
        owners = [claim.owner for claim in claims]
        now = time.monotonic()
        with self._lock:
            held = self._held
            if not answered:  # claims of records just read: none is held yet
                held.update(zip(owners, claims, strict=True))
                self._since.update(dict.fromkeys(owners, now))
                self._unanswered.update(owners)
                return
            if self._unanswered:  # their max_hold_s clock starts over now (see the docstring)
                answered_now = self._unanswered.intersection(owners)
                if answered_now:
                    self._unanswered.difference_update(answered_now)
                    self._since.update(dict.fromkeys(answered_now, now))
            missing = set(owners).difference(held)  # not sent ahead, or dropped by a renewal
            if missing:
                held.update((claim.owner, claim) for claim in claims if claim.owner in missing)
                self._since.update(dict.fromkeys(missing, now))

    def drop(self, claims: Sequence[Claim]) -> None:
        """Stop renewing ``claims``; returns once no renewal of them can still be sent."""
        owners = [claim.owner for claim in claims]
        with self._lock:
            forget_claim, forget_since = self._held.pop, self._since.pop
            for owner in owners:
                forget_claim(owner, None)
                forget_since(owner, None)
            if self._unanswered:
                self._unanswered.difference_update(owners)

    def drop_all(self) -> None:
        with self._lock:
            self._held.clear()
            self._since.clear()
            self._unanswered.clear()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def renew(self) -> None:
        """Renew every held claim now (one round trip, two when some answers are not read
        yet); the thread calls it on its schedule."""
        with self._lock:
            stale = time.monotonic() - self._max_hold_s
            since = self._since
            claims = [claim for owner, claim in self._held.items() if since[owner] > stale]
            if len(claims) < len(self._held):
                log.warning("%d claims held past max.poll.interval.ms (a stalled handler): no "
                            "longer renewed", len(self._held) - len(claims))
                self._held = {claim.owner: claim for claim in claims}
                self._since = {claim.owner: since[claim.owner] for claim in claims}
                self._unanswered.intersection_update(self._held)
            if not claims:
                return
            self.renewals += 1
            unanswered = self._unanswered
            sent = [claim for claim in claims if claim.owner in unanswered]
            if sent:
                claims = [claim for claim in claims if claim.owner not in unanswered]
            for claim, result, _ in self._dedup.claim(claims) if claims else ():
                if result not in _KEPT:  # BUSY: lapsed and taken; DONE/EXPIRED: settled
                    if self._held.pop(claim.owner, None) is not None:
                        del self._since[claim.owner]
                    if result is ClaimResult.BUSY:
                        self.lost += 1
                        log.warning("claim on %s lapsed and was taken over before renewal; "
                                    "its done mark will be refused", claim.message_id)
            if sent:
                # Whatever it answers, nothing is dropped: this may run before the claims do
                # (another connection), and their answer, when read, drops what is not ours.
                self._dedup.renew(sent)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.renew()
            except StoreError as exc:  # the claims may lapse: done marks then say so
                log.warning("renewing %d claims failed: %s", self.held(), exc)
