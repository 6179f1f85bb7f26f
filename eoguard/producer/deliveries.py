"""Kafka delivery reports -> the ledger's acked and delivery_failed, and ack-latency samples.

librdkafka's delivery callbacks only append ``(token, err, msg)`` to a deque (they run
inside ``poll`` on whichever thread polled); :meth:`Deliveries.process` translates what
they collected into one :meth:`Ledger.acked` call (and one :meth:`Ledger.delivery_failed`
call when some failed), which settle the messages.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from eoguard.errors import EoguardError
from eoguard.kafka.producer import delivery_error, is_unavailable
from eoguard.modes import KeepUntil
from eoguard.producer.delay import LatencyWindow
from eoguard.producer.ledger import Ledger
from eoguard.producer.messages import PendingMessage
from eoguard.producer.recovery import ResendToken

__all__ = ["Deliveries"]

log = logging.getLogger(__name__)


class Deliveries:
    """Translates one producer's delivery reports into ledger transitions."""

    def __init__(self, *, ledger: Ledger,
                 reports: collections.deque[tuple[Any, Any, Any]]) -> None:
        self.ledger = ledger
        self.reports = reports
        self.latency = LatencyWindow()

    def process(self) -> None:
        """Settle the reports collected so far (any thread; no application code runs here)."""
        acked: list[PendingMessage] = []
        resent: list[tuple[str, KeepUntil]] = []
        failed: list[tuple[PendingMessage, EoguardError, bool]] = []
        resends_failed: list[tuple[str, bool]] = []
        errors: list[EoguardError] = []
        reports, add_latency, ack = self.reports, self.latency.add_s, acked.append
        while reports:
            token, err, kmsg = reports.popleft()
            if token.__class__ is ResendToken:
                if err is None:
                    resent.append((token.message_id, token.keep_until))
                else:
                    errors.append(delivery_error(err))
                    resends_failed.append((token.message_id, is_unavailable(err)))
            elif err is None:
                latency_s = kmsg.latency()
                if latency_s is not None:
                    add_latency(latency_s)
                ack(token)
            else:
                error = delivery_error(err, topic=token.topic)
                errors.append(error)
                failed.append((token, error, is_unavailable(err)))
        if acked or resent:
            self.ledger.acked(acked, resent)
        if errors:
            self.ledger.delivery_failed(failed, resends_failed)
            log.warning("%d deliveries failed (first: %s); those in the outbox stay pending "
                        "until recovery resends them", len(errors), errors[0])
