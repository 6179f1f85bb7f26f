"""Steps 2-7 of the GuardedConsumer loop for one batch: decode, claim, handle, done, retry.

See :mod:`eoguard.guard.consumer` for the whole loop. Redis or Kafka failing here raises
(StoreError, BrokerError, DeadLetterError) and the consumer rewinds the batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Message

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.config import ConsumerConfig
from eoguard.envelope import Envelope, now_ms
from eoguard.errors import CodecError, ConsumerError
from eoguard.guard.dead_letter import DeadLetterReason, DeadLetterRouter
from eoguard.guard.handler import BatchHandler, ContextEnv, Handler, HandlerContext, Inbound
from eoguard.kafka.sink import DeliverySink
from eoguard.store.dedup import ClaimResult, DedupStore, DoneResult
from eoguard.store.outbox import Outbox

log = logging.getLogger(__name__)

_HANDLE = frozenset(r for r in ClaimResult if r.should_handle)


@dataclass(slots=True)
class ConsumerStats:
    """Counters since the consumer started (a copy is returned by ``stats()``)."""

    polled: int = 0
    handled: int = 0
    duplicates: int = 0  # DONE at claim time: handled before (by this scope)
    fenced: int = 0  # handled here, but the done mark was refused (another owner finished)
    expired: int = 0
    dead_lettered: int = 0
    retries: int = 0
    busy_waits: int = 0
    busy_skipped: int = 0
    claim_round_trips: int = 0
    in_flight: int = 0
    store_outages: int = 0
    commits: int = 0


class BatchProcessor:
    """Runs one batch through claim -> handler -> done, with retries, busy waits, dead letters."""

    def __init__(self, config: ConsumerConfig, *, dedup: DedupStore, outbox: Outbox | None,
                 sink: DeliverySink, dead: DeadLetterRouter, env: ContextEnv,
                 handler: Handler | None, batch_handler: BatchHandler | None,
                 codec: EnvelopeCodec, payloads: PayloadCodec) -> None:
        self.config = config
        self._dedup, self._outbox, self._sink, self._dead = dedup, outbox, sink, dead
        self._env, self._codec, self._payloads = env, codec, payloads
        self._handler, self._batch_handler = handler, batch_handler
        self.stats = ConsumerStats()
        self.in_flight: list[Inbound] = []  # claimed or being claimed; released on revoke

    def process(self, msgs: list[Message]) -> None:
        """Steps 2-7 for one consumed batch; raises StoreError / BrokerError / DeadLetterError."""
        pending = self._decode(msgs)
        busy_until = time.monotonic() + self.config.busy_wait_s
        while pending:
            pending, wait_s = self._round(pending, busy_until)
            if pending and wait_s > 0:
                time.sleep(wait_s)

    def _decode(self, msgs: list[Message]) -> list[Inbound]:
        items, now, scope, new_claim = [], now_ms(), self.config.scope, self._dedup.new_claim
        for msg in msgs:
            try:  # Step 2.
                envelope = self._codec.decode(msg.value())
                payload = self._payloads.decode_envelope(envelope)
            except CodecError as exc:
                self._dead.route(msg, reason=DeadLetterReason.MALFORMED,
                                 error_type=type(exc).__name__, error=str(exc))
                continue
            if envelope.expires_at_ms <= now:  # Step 3. (Envelope.is_expired, inlined)
                self._expired(msg, envelope)
                continue
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            owner = f"{scope}|{topic}|{partition}|{offset}"  # owner_token(), inlined: hot path
            items.append(Inbound(msg, topic, partition, offset, envelope, payload,
                                 new_claim(envelope.id, owner, envelope.expires_at_ms)))
        return items

    def _round(self, pending: list[Inbound], busy_until: float) -> tuple[list[Inbound], float]:
        """Steps 4-7 once; returns what goes back to Step 4 and how long to wait first."""
        cfg = self.config
        self.in_flight = pending
        outcomes = self._dedup.claim([item.claim for item in pending])  # Step 4.
        claimed, busy, lease_left_ms = [], [], []
        for item, outcome in zip(pending, outcomes, strict=True):
            if outcome.result in _HANDLE:
                claimed.append(item)
            elif outcome.result is ClaimResult.BUSY:
                busy.append(item)
                lease_left_ms.append(outcome.lease_ms)
            elif outcome.result is ClaimResult.DONE:
                self.stats.duplicates += 1
            else:
                self._expired(item.msg, item.envelope)
        failed = self._handle(claimed)  # Steps 5 and 6.
        retry: list[Inbound] = []
        waits: list[float] = []
        if failed:  # Step 7.
            self._dedup.release([item.claim for item in failed])
            for item in failed:
                if item.attempts > cfg.max_retries:
                    self._give_up(item)
                else:
                    retry.append(item)
                    self.stats.retries += 1
            if retry:
                first = min(item.attempts for item in retry)
                waits.append(min(cfg.retry_backoff_s * 2 ** (first - 1), cfg.retry_backoff_max_s))
        if busy and time.monotonic() >= busy_until:
            self.stats.busy_skipped += len(busy)
        elif busy:
            self.stats.busy_waits += 1
            retry += busy
            # A duplicate of a message handled in this very batch is DONE at once: no wait.
            lease_s = 0.0 if claimed else min(lease_left_ms) / 1000 + 0.01
            waits.append(min(lease_s, max(0.0, busy_until - time.monotonic())))
        return retry, min(waits, default=0.0)

    def _handle(self, items: list[Inbound]) -> list[Inbound]:
        """Run the handler, produce outputs, mark done; returns the items that failed."""
        if not items:
            return []
        contexts = [self._context(item) for item in items]
        self._call_handler(items, contexts)
        ok = [(item, ctx) for item, ctx in zip(items, contexts, strict=True) if item.error is None]
        failed = [item for item in items if item.error is not None]
        return failed + self._complete(ok) if ok else failed

    def _call_handler(self, items: list[Inbound], contexts: list[HandlerContext]) -> None:
        if self._handler is not None:
            for item, ctx in zip(items, contexts, strict=True):
                try:
                    self._handler(ctx)
                except Exception as exc:  # noqa: BLE001 - any handler error is a failure
                    item.error = exc
            return
        assert self._batch_handler is not None
        try:
            errors = self._batch_handler(contexts) or {}
        except Exception as exc:  # noqa: BLE001 - any handler error fails the whole batch
            errors = {item.envelope.id: exc for item in items}
        for item in items:
            item.error = errors.get(item.envelope.id)

    def _complete(self, ok: list[tuple[Inbound, HandlerContext]]) -> list[Inbound]:
        """Step 6: outputs, then done + effects + outbox ack; returns the refused items."""
        outputs = [out for _, ctx in ok for out in ctx.outputs]
        for out in outputs:
            self._sink.produce(out.topic, out.value, out.key)
        if outputs:
            self._sink.flush()
        effects = {item.envelope.id: fx for item, ctx in ok if (fx := ctx.effects)}
        ids = [item.envelope.id for item, _ in ok]
        extra = self._outbox.ack_calls(ids) if self._outbox is not None else []
        results = self._dedup.done([item.claim for item, _ in ok], effects, extra=extra)
        failed = []
        for (item, _), result in zip(ok, results, strict=True):
            if result.result is DoneResult.OK:
                self.stats.handled += 1
            elif result.result is DoneResult.EFFECT_ERROR:
                item.error = ConsumerError(f"Redis effects refused: {result.detail}")
                failed.append(item)
            else:
                self.stats.fenced += 1
        return failed

    def _context(self, item: Inbound) -> HandlerContext:
        item.attempts += 1
        item.error = None
        return HandlerContext(item, item.attempts, self._env)

    def _expired(self, msg: Message, envelope: Envelope) -> None:
        self.stats.expired += 1
        if self.config.expired_to_dead_letter:
            self._dead.route(msg, reason=DeadLetterReason.EXPIRED, error_type="Expired",
                             error=f"expired at {envelope.expires_at_ms}",
                             message_id=envelope.id)

    def _give_up(self, item: Inbound) -> None:
        error = item.error
        log.warning("message %s failed %d times, dead-lettered: %r", item.envelope.id,
                    item.attempts, error)
        self._dead.route(item.msg, reason=DeadLetterReason.HANDLER_FAILED,
                         error_type=type(error).__name__, error=str(error),
                         attempts=item.attempts, message_id=item.envelope.id)
