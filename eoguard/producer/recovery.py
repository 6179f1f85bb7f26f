"""Recovery: resend outbox records that lack evidence of publication; sweep expired entries.

A pending record is resent only when its owner's liveness lease lapsed (the producer is
gone) or its delivery timed out (not marked published ``resend_after`` after it was
written or last claimed). Published records are never in the index, so a slow consumer
never causes a resend. Ownership is taken atomically per record (a compare-and-set in
``outbox_claim_for_resend.lua``), so two producers recovering at once never both resend one
record. A resend keeps the message id and carries ``attempt + 1`` (in the envelope, or in the
``ce_eoguardattempt`` header of the header wire format, whose other headers the record
keeps); the consumer's dedup drops any duplicate it creates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from eoguard.codec import EnvelopeCodec
from eoguard.codec.headers import ATTEMPT, MARKER
from eoguard.errors import BrokerError, CodecError
from eoguard.kafka.producer import KafkaProducer
from eoguard.modes import KeepUntil
from eoguard.producer.messages import ReportSink
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import ClaimBatch, ClaimedRecord, Outbox

__all__ = ["Recovery", "RecoveryReport", "ResendToken"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryReport:
    """One recovery pass: records claimed and handed to Kafka, and what the scavenger removed."""

    claimed: int
    resent: int
    swept: int  # index entries whose record had expired (or was acked)
    expired: int  # pending records past expires_at: deleted, never resent


class ResendToken:
    """Identifies a resend in the delivery reports (its record is marked published on ack,
    by the record's own ``keep_until``)."""

    __slots__ = ("keep_until", "message_id", "sink")

    def __init__(self, message_id: str, keep_until: KeepUntil, sink: ReportSink) -> None:
        self.message_id = message_id
        self.keep_until = keep_until
        self.sink = sink

    def delivered(self, err: object, msg: object) -> None:
        self.sink((self, err, msg))


class Recovery:
    """Claims due records for this producer instance and hands them to its Kafka producer."""

    def __init__(self, *, outbox: Outbox, liveness: Liveness, codec: EnvelopeCodec,
                 kafka: KafkaProducer, instance_id: str, resend_after_ms: int,
                 sink: ReportSink, produce_timeout_s: float = 5.0) -> None:
        self.outbox = outbox
        self.liveness = liveness
        self.codec = codec
        self.kafka = kafka
        self.instance_id = instance_id
        self.resend_after_ms = resend_after_ms
        self.sink = sink
        self.produce_timeout_s = produce_timeout_s

    def run(self) -> RecoveryReport:
        """One pass; raises :class:`StoreError` when Redis cannot be used.

        Step 1. Read the live producers, with Redis's clock.
        Step 2. Claim every pending record that is due or whose owner is not live; the
                scavenger sweeps index entries of expired records on the way.
        Step 3. Resend each claimed record with the new attempt, same id.
        """
        # Step 1.
        live = self.liveness.live()
        owners = {*live.deadlines, self.instance_id}
        # Step 2.
        batch = self.outbox.claim_for_resend(
            claimer=self.instance_id, live_owners=owners, live_read_at_ms=live.read_at_ms,
            resend_after_ms=self.resend_after_ms)
        # Step 3.
        report = self._resend_all(batch)
        if batch.records or batch.swept or batch.expired:
            log.info("recovery: claimed %d, resent %d, swept %d, expired %d",
                     report.claimed, report.resent, report.swept, report.expired)
        return report

    def resend_ids(self, message_ids: Sequence[str]) -> RecoveryReport:
        """Resend the named pending records now, whoever owns them (``eoguard outbox resend``).

        The operator's decision overrides the owners' leases: every owner (this instance
        too) is treated as gone; the claim stays atomic, so each record is resent once per call.
        Published, expired and absent records are not resent.
        """
        live = self.liveness.live()
        batch = self.outbox.claim_ids_for_resend(
            message_ids, claimer=self.instance_id, live_owners=(),
            live_read_at_ms=live.read_at_ms + 1, resend_after_ms=self.resend_after_ms)
        return self._resend_all(batch)

    def resend_failed(self, message_ids: Sequence[str]) -> RecoveryReport:
        """Resend this producer's own records whose delivery Kafka reported failed.

        librdkafka retries nothing after that report, so they need not wait out
        ``resend_after`` (which only keeps other producers from racing a live one's retries).
        A record another live producer claimed meanwhile is left to it; published, expired
        and absent records are skipped.
        """
        live = self.liveness.live()
        others = set(live.deadlines) - {self.instance_id}
        batch = self.outbox.claim_ids_for_resend(
            message_ids, claimer=self.instance_id, live_owners=others,
            live_read_at_ms=live.read_at_ms, resend_after_ms=self.resend_after_ms)
        return self._resend_all(batch)

    def _resend_all(self, batch: ClaimBatch) -> RecoveryReport:
        """Resend a claimed batch in order, stopping at the first record librdkafka cannot
        take: the rest stay claimed by this producer and are due again after resend_after."""
        resent = 0
        for rec in batch.records:
            outcome = self._resend(rec)
            if outcome is None:
                break
            resent += outcome
        return RecoveryReport(claimed=len(batch.records), resent=resent, swept=batch.swept,
                              expired=batch.expired)

    def _resend(self, rec: ClaimedRecord) -> bool | None:
        """True when handed to librdkafka, False when Kafka refused it, None when
        librdkafka's queue stayed full."""
        headers = rec.headers or None
        if headers is not None and MARKER in headers:  # the header format: attempt is a header
            value = rec.value
            headers = {**headers, ATTEMPT: str(rec.attempt)}
        else:
            try:
                value = self.codec.encode(self.codec.decode(rec.value).with_attempt(rec.attempt))
            except CodecError as exc:
                # Not ours to judge: the consumer dead-letters what it cannot decode.
                log.error("outbox record %s does not decode (%s); resending it unchanged",
                          rec.id, exc)
                value = rec.value
        token = ResendToken(rec.id, rec.keep_until, self.sink)
        deadline = time.monotonic() + self.produce_timeout_s
        try:
            while not self.kafka.produce(rec.topic, value, rec.key, headers=headers,
                                         on_delivery=token.delivered):
                if time.monotonic() > deadline:
                    # Still claimed by us: due again after resend_after, then retried.
                    log.warning("librdkafka's queue stayed full; resend of %s deferred", rec.id)
                    return None
                time.sleep(0.005)
        except BrokerError as exc:
            log.error("Kafka refused the resend of %s: %s", rec.id, exc)
            return False
        return True
