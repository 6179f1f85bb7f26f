"""What the producer still owes the outbox for records Kafka answered: publish marks, resends.

Plain data of one :class:`~eoguard.producer.ledger.Ledger`, which changes it under its lock
(nothing else holds a reference). Publish marks wait up to ``MARK_DELAY_S`` for an outbox
write to ride along with (one round trip, one fsync) before going alone.
"""

from __future__ import annotations

import time

from eoguard.modes import KeepUntil

__all__ = ["MARK_DELAY_S", "MAX_RESEND_IDS", "PublishMarks"]

MARK_DELAY_S = 0.01
"""How long publish marks wait for an outbox write to ride along with before going alone."""

MAX_RESEND_IDS = 100_000
"""Failed deliveries remembered for a prompt resend (the rest wait out resend_after)."""


class PublishMarks:
    """Acknowledged records to mark published, and this producer's records to resend at once."""

    __slots__ = ("due_mono", "in_flight", "own", "resend_ids", "resent")

    def __init__(self) -> None:
        # This producer's own records (its keep_until), and resent ones (each with the
        # record's keep_until), in the order Kafka acknowledged them.
        self.own: list[str] = []
        self.resent: list[tuple[str, KeepUntil]] = []
        self.due_mono = 0.0  # monotonic time by which the waiting marks are written
        self.in_flight = 0  # marks taken for a write not finished yet
        # Outbox records whose delivery Kafka reported failed for want of a broker: librdkafka
        # retries nothing after that report, so the maintenance thread resends them at once
        # instead of waiting out resend_after.
        self.resend_ids: list[str] = []

    @property
    def waiting(self) -> int:
        """Marks not yet taken for a write."""
        return len(self.own) + len(self.resent)

    @property
    def outstanding(self) -> int:
        """Marks not yet written."""
        return len(self.own) + len(self.resent) + self.in_flight

    def add(self, own: list[str], resent: list[tuple[str, KeepUntil]]) -> bool:
        """Queue marks; True when they are the first waiting (the flusher should wake)."""
        first = not self.own and not self.resent
        if first:
            self.due_mono = time.monotonic() + MARK_DELAY_S
        self.own += own
        self.resent += resent
        return first

    def take(self) -> tuple[list[str], list[tuple[str, KeepUntil]]]:
        """Every waiting mark, in flight until :meth:`done` or :meth:`put_back`."""
        own, self.own = self.own, []
        resent, self.resent = self.resent, []
        self.in_flight += len(own) + len(resent)
        return own, resent

    def done(self, count: int) -> None:
        """A write carrying ``count`` taken marks succeeded."""
        self.in_flight -= count

    def put_back(self, own: list[str], resent: list[tuple[str, KeepUntil]]) -> None:
        """Writes carrying these marks failed: first in line again (else recovery would
        resend those records)."""
        self.own[:0] = own
        self.resent[:0] = resent
        self.in_flight -= len(own) + len(resent)

    def add_resend_ids(self, ids: list[str], *, first: bool = False) -> None:
        """Remember records to resend at once (at the front with ``first``), within the cap."""
        merged = ids + self.resend_ids if first else self.resend_ids + ids
        self.resend_ids = merged[:MAX_RESEND_IDS]

    def take_resend_ids(self) -> list[str]:
        ids, self.resend_ids = self.resend_ids, []
        return ids
