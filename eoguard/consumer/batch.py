"""Steps 2-7 of the GuardedConsumer loop: decode, claim, handle, done, plan the retries.

A :class:`Batch` holds the records of one ``consume`` call: the unit whose offsets are stored
and committed, and (dedup v2) one claim pass: its claims name the batch's token, and its lease
and done mark are the batch's records. :class:`BatchProcessor` takes batches through the
steps and builds their Redis calls; :mod:`eoguard.consumer.pipeline` decides which round trip
carries them. Redis or Kafka failing here raises an UnavailableError and the consumer rewinds
what it holds.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from eoguard.backoff import doubling_s
from eoguard.callbacks import awaitable_refused
from eoguard.codec import EnvelopeHeads, check_envelope, read_plain
from eoguard.codec.headers import header_envelope, header_payload, read_headers
from eoguard.config import ConsumerConfig
from eoguard.consumer.dead_letter import DeadLetterReason, DeadLetterRouter
from eoguard.consumer.handler import (
    BatchHandler,
    ContextEnv,
    Deferred,
    Handler,
    HandlerContext,
    Inbound,
    OutputRecord,
)
from eoguard.consumer.leases import BatchLeases
from eoguard.consumer.state import Batch, ConsumerStats
from eoguard.envelope import Envelope, now_ms
from eoguard.errors import CodecError, StateError, StoreError, StoreOutOfMemoryError
from eoguard.kafka.consumer import Partition
from eoguard.kafka.sink import DeliverySink
from eoguard.store.claim_policy import CONSUMER, BusyWait, Verdict
from eoguard.store.dedup import (
    Claim,
    ClaimReport,
    ClaimResult,
    DedupStore,
    DoneReport,
    DoneResult,
)
from eoguard.store.outbox import Outbox
from eoguard.store.scripts import Prepared

log = logging.getLogger(__name__)

Send = Callable[[list[Prepared[Any]]], Callable[[], list[Any]]]
"""Sends prepared calls in one round trip; the function returned reads their parsed replies."""

_NEW, _BUSY = ClaimResult.NEW, ClaimResult.BUSY
_POLICY = CONSUMER
_HANDLE, _WAIT, _DUPLICATE = Verdict.HANDLE, Verdict.WAIT, Verdict.DUPLICATE
_REDELIVERED, _DEAD_LETTER, _EXPIRED = Verdict.REDELIVERED, Verdict.DEAD_LETTER, Verdict.EXPIRED
_OK, _EFFECT_ERROR, _ABSENT = DoneResult.OK, DoneResult.EFFECT_ERROR, DoneResult.ABSENT
_PARTIAL = DoneResult.PARTIAL
_EXPIRED_IN_BATCH = StateError("expired while its batch was handled")  # marks, never raised


class BatchProcessor:
    """Takes batches through decode -> claim -> handler -> done, with retries and dead letters."""

    def __init__(self, config: ConsumerConfig, *, dedup: DedupStore, outbox: Outbox | None,
                 sink: DeliverySink, dead: DeadLetterRouter, env: ContextEnv,
                 leases: BatchLeases, send: Send, handler: Handler | None,
                 batch_handler: BatchHandler | None) -> None:
        self.config = config
        self.send = send  # every round trip to Redis goes through it (the pipeline's too)
        self.leases = leases  # renews a batch's records from its claims to its done marks
        self._dedup, self._outbox, self._sink, self._dead = dedup, outbox, sink, dead
        self._env, self._codec, self._payloads = env, env.codec, env.payloads
        # Typed to return object: what it returns is looked at (an awaitable fails it).
        self._handler: Callable[[HandlerContext], object] | None = handler
        self._batch_handler = batch_handler
        self._key_prefixes = dedup.keys.dedup_prefixes(config.scope)
        self._limits = config.effective_limits()
        # position(group, topic, ...) up to the topic: the group is this consumer's reader
        group = str(config.kafka["group.id"])
        self._reader = f"{len(group)}:{group}|"
        self._topics: dict[str, str] = {}  # topic -> its length-prefixed part of a position
        self._plain = config.plain_records
        self._heads = EnvelopeHeads(env.codec.registry)
        self._framed = None if env.framed is None else env.framed.decode
        self.stats = ConsumerStats()

    # Steps 2 and 3 ---------------------------------------------------------------------
    def decode(self, msgs: list[Message]) -> Batch:
        """Decode envelopes and payloads; dead-letter the malformed, drop the expired."""
        items: list[Inbound] = []
        ends: dict[Partition, int] = {}
        now, reader, prefixes, topics = now_ms(), self._reader, self._key_prefixes, self._topics
        # KeySpace.shard_of and store.dedup.position() inlined (hot path); the copies are
        # pinned to the definitions by tests/unit/test_decode_inline.py.
        shards, crc32 = len(prefixes), zlib.crc32
        decode, payload_of, new_tuple = self._codec.decode, self._payloads.decode, tuple.__new__
        max_ttl_ms, limits = self.config.keyspace.max_ttl_ms, self._limits
        plain, is_envelope, framed = self._plain, self._heads.holds, self._framed
        for msg in msgs:
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            ends[topic, partition] = offset + 1
            value = msg.value()
            try:  # Step 2. Untrusted input: checked (id normalised) before any key is built.
                headers = msg.headers()  # None for an envelope eoguard wrote: no headers
                fields = read_headers(headers) if headers else None
                if fields is not None:  # the header format (docs/design.md §3)
                    envelope = check_envelope(header_envelope(fields, value), now_ms=now,
                                              max_ttl_ms=max_ttl_ms, limits=limits)
                    # An expired record is dropped below: its payload is not fetched for it.
                    payload = (header_payload(fields, value, framed)
                               if envelope.expires_at_ms > now else None)
                elif plain is None or is_envelope(value):  # one cheap check picks the path
                    envelope = check_envelope(decode(value), now_ms=now, max_ttl_ms=max_ttl_ms,
                                              limits=limits)
                    schema = envelope.payload_schema
                    payload = envelope.payload if schema is None else payload_of(
                        envelope.payload, schema, envelope.payload_fingerprint)
                else:  # a plain record: its id and expiry from the application's rules
                    envelope, payload = self._read_plain(msg, value, now)
            except CodecError as exc:
                self._dead.route(msg, reason=DeadLetterReason.MALFORMED,
                                 error_type=type(exc).__name__, error=str(exc))
                continue
            expires_at = envelope.expires_at_ms
            if expires_at <= now:  # Step 3. (Envelope.is_expired, inlined)
                self._expired(msg, envelope)
                continue
            mid = envelope.id
            shard = crc32(mid.encode()) % shards
            part = topics.get(topic)
            if part is None:
                part = topics[topic] = f"{reader}{len(topic)}:{topic}|"
            where = f"{part}{partition}|{offset}"  # store.dedup.position(), inlined
            # Claim(...) without the NamedTuple's Python-level __new__: half the cost.
            claim = new_tuple(Claim, (mid, where, expires_at, shard, prefixes[shard] + mid))
            items.append(Inbound(msg, envelope, payload, claim))
        return Batch(msgs, items, ends)

    def _read_plain(self, msg: Message, value: bytes | None, now: int) -> tuple[Envelope, Any]:
        """A plain record's synthetic envelope and payload (:func:`eoguard.codec.read_plain`)."""
        assert self._plain is not None
        kind, stamp = msg.timestamp()
        return read_plain(self._plain, value, key=msg.key(), headers=msg.headers(),
                          timestamp_ms=stamp if kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0
                          else None, topic=msg.topic() or "", partition=msg.partition() or 0,
                          offset=msg.offset() or 0,
                          now_ms=now, max_ttl_ms=self.config.keyspace.max_ttl_ms,
                          limits=self._limits)

    # Step 4 ------------------------------------------------------------------------------
    def claim_call(self, batch: Batch) -> Prepared[ClaimReport]:
        """A new claim pass for ``batch``: a fresh token, its records renewed from now on."""
        batch.token = token = self._dedup.new_token()
        claims = batch.claims()
        self.leases.hold(token, self._dedup.records(token, claims))
        return self._dedup.prepare_claim(token, claims, fresh=True)

    def sort_claims(self, batch: Batch, report: ClaimReport) -> None:
        """Keep in ``batch.items`` (and ``batch.claimed``) what the claim pass made ours;
        set BUSY items aside; count, dead-letter or drop the rest (what each outcome means:
        :data:`eoguard.store.claim_policy.CONSUMER`)."""
        if not batch.busy_until:  # set at the first claim: retries do not extend it
            batch.busy_until = BusyWait.starting_now(self.config.busy_wait_s).deadline
        results = report.results
        if results.count(_NEW) == len(results):  # the common case: all ours
            batch.claimed = batch.items
            return
        mine: list[Inbound] = []
        for i, (item, result) in enumerate(zip(batch.items, results, strict=True)):
            # A BUSY copy of a message a pass of ours holds (read ahead, or earlier in this
            # batch): that pass handles it, or releases it to be read again. Waiting here
            # would wait on ourselves: the pass is handled after this batch.
            own = result is _BUSY and self.leases.holds(report.holders.get(i, ""))
            verdict = _POLICY.verdict(result, own_holder=own)
            if verdict is _HANDLE:
                mine.append(item)
            elif verdict is _WAIT:
                batch.busy.append(item)
                batch.lease_left_ms.append(report.lease_ms[i])
            elif verdict is _DUPLICATE:
                self.stats.duplicates += 1
            elif verdict is _REDELIVERED:
                self.stats.redelivered += 1
            elif verdict is _DEAD_LETTER:
                self._partial(item, "effects partially applied by an earlier attempt of this "
                                    "record (re-read before its dead letter was sent)")
            elif verdict is _EXPIRED:
                self._expired(item.msg, item.envelope)
            else:  # STALE or PASSED: a consumer's token is fresh and never gives up a claim
                raise StateError(f"batch {batch.token} is done already, or gave up {result.name} "
                                 "claims; a consumer never does: not claiming under it")
        batch.items = batch.claimed = mine

    # Steps 5 and 6 -----------------------------------------------------------------------
    def handle(self, items: list[Inbound]) -> tuple[list[Inbound], list[Inbound]]:
        """Run the handler and produce its outputs (acks=all); returns (succeeded, failed).

        A context lives for one handler call: what it queued (effects, outputs) is taken
        off it at once, so nothing per message but the :class:`Inbound` outlives the call
        (fewer objects for the cyclic GC to walk: a few microseconds per message).
        """
        now = now_ms()  # Step 5 re-checks expiry: a claim made in time may be handled late
        if any(item.envelope.expires_at_ms <= now for item in items):
            live = []
            for item in items:
                if item.envelope.expires_at_ms <= now:
                    self._expired(item.msg, item.envelope)  # its claim is released by the done
                else:
                    live.append(item)
            items = live
        if not items:
            return [], []
        if self._handler is not None:
            outputs, late = self._call_handler(items)
        else:
            late, outputs = False, self._call_batch_handler(items)
        if late:  # expired in the batch: neither handled nor failed; the done releases them
            items = [item for item in items if item.error is not _EXPIRED_IN_BATCH]
        for out in outputs:
            self._sink.produce(out.topic, out.value, out.key)
        if outputs:
            self._sink.flush()
        failed = [item for item in items if item.error is not None]
        return ([item for item in items if item.error is None] if failed else items), failed

    def _call_handler(self, items: list[Inbound]) -> tuple[list[OutputRecord], bool]:
        """The per-message handler on each item; True with the outputs when some expired
        before their turn (they are marked ``_EXPIRED_IN_BATCH``, counted and not handled)."""
        assert self._handler is not None
        env, handler = self._env, self._handler
        outputs: list[OutputRecord] = []
        late = False
        for item in items:
            # Each message's expiry again right before its handler: the ones before it in
            # the batch may have taken long enough for it to expire meanwhile.
            if item.envelope.expires_at_ms <= now_ms():
                self._expired(item.msg, item.envelope)
                item.error, late = _EXPIRED_IN_BATCH, True
                continue
            item.attempts += 1
            ctx = HandlerContext(item, item.attempts, env)
            try:
                returned = handler(ctx)
            except Exception as exc:  # noqa: BLE001 - any handler error is a failure
                item.error = exc
                continue
            if returned is not None:  # an awaitable ran nothing: a failure, never marked done
                refused = awaitable_refused(returned, "handler")
                if refused is not None:
                    item.error = refused
                    continue
            item.error = None
            item.effects = ctx.effects
            if ctx.outputs:
                outputs += ctx.outputs
        return outputs, late

    def _call_batch_handler(self, items: list[Inbound]) -> list[OutputRecord]:
        assert self._batch_handler is not None
        contexts = []
        for item in items:
            item.attempts += 1
            contexts.append(HandlerContext(item, item.attempts, self._env))
        try:
            errors = self._batch_handler(contexts) or {}
        except Exception as exc:  # noqa: BLE001 - any handler error fails the whole batch
            errors = {item.envelope.id: exc for item in items}
        refused = awaitable_refused(errors, "batch_handler")  # an awaitable is truthy
        if refused is not None:  # it ran nothing: the whole batch failed
            errors = {item.envelope.id: refused for item in items}
        for item in items:
            item.error = errors.get(item.envelope.id)
        # A Deferred message waits behind a failed one of its key: not an attempt of its own,
        # unless no message of the call failed (then nothing bounds the deferrals, and it
        # counts); an error under an id that is no message of the call fails nothing.
        failing = any(item.error is not None and not isinstance(item.error, Deferred)
                      for item in items)
        outputs: list[OutputRecord] = []
        for item, ctx in zip(items, contexts, strict=True):
            if item.error is None:
                item.effects = ctx.effects
                outputs += ctx.outputs
            elif failing and isinstance(item.error, Deferred):
                item.attempts -= 1
        return outputs

    def done_call(self, batch: Batch, ok: list[Inbound]) -> Prepared[DoneReport]:
        """The claim pass's done marks: ``ok`` handled (with their Redis effects), every other
        claim of the pass released (failed, dropped); then the senders' outbox acks."""
        self.leases.drop(batch.token)
        claimed = batch.claimed
        handled = None
        if len(ok) != len(claimed):
            done = {id(item) for item in ok}
            handled = [id(item) in done for item in claimed]
        effects = {item.envelope.id: item.effects for item in ok if item.effects}
        extra = self._outbox.ack_calls([item.envelope.id for item in ok]) \
            if self._outbox is not None and ok else []
        return self._dedup.prepare_done(batch.token, [item.claim for item in claimed],
                                        handled=handled, effects=effects, extra=extra)

    def sort_done(self, batch: Batch, ok: list[Inbound], report: DoneReport) -> list[Inbound]:
        """Count what was marked done; returns the handled items to claim and handle again
        (effects refused, or the claim vanished: nothing of theirs was applied)."""
        results = report.results
        claimed, batch.claimed = batch.claimed, []
        if len(ok) == len(claimed) and results.count(_OK) == len(results):  # the common case
            self.stats.handled += len(ok)
            return []
        handled = {id(item) for item in ok}
        again: list[Inbound] = []
        for i, (item, result) in enumerate(zip(claimed, results, strict=True)):
            if id(item) not in handled:
                continue  # released, or no longer ours anyway
            if result is _OK:
                self.stats.handled += 1
            elif result is _EFFECT_ERROR and report.refused_for_memory(i):
                # Redis was full, the message is not at fault: again, not counted a failure.
                item.error = StoreOutOfMemoryError(f"Redis is full: {report.details[i]}")
                item.store_refused += 1
                again.append(item)
            elif result is _EFFECT_ERROR:
                item.error = StoreError(f"Redis effects refused: {report.details[i]}")
                again.append(item)
            elif result is _PARTIAL:  # done already (never re-applied): no retry, report it
                self._partial(item, report.details[i])
            elif result is _ABSENT:
                # Nothing was applied, so handling again is the only way not to lose it.
                item.error = StateError("the claim vanished before done (expired, forgotten "
                                        "or lost in a failover); claiming again")
                item.store_refused += 1
                again.append(item)
            else:  # NOT_OWNED (re-owned or taken over), ALREADY_DONE: another attempt decides
                self.stats.fenced += 1
        return again

    # Step 7 ------------------------------------------------------------------------------
    def plan(self, failed: list[Inbound], batch: Batch, *,
             handled_any: bool) -> tuple[list[Inbound], float]:
        """What goes back to Step 4 (failed claims already released) and the wait before it.

        Past ``max_retries`` failures of its handler a message is dead-lettered (a done mark
        that a full Redis refused, or whose claim vanished, is no failure of the handler). A
        BUSY one is claimed again with a growing backoff (``retry_backoff_s`` doubling, jittered, capped
        by the other owner's lease left): a live owner marks it done within its batch, a dead
        one's lease lapses and it is taken over. Past ``busy_wait_s`` it is skipped (its record is uncommitted
        where it is claimed, and handled or re-owned there).
        """
        cfg = self.config
        retry: list[Inbound] = []
        waits: list[float] = []
        for item in failed:
            if item.failures > cfg.max_retries:
                self._dead_letter_failed(item)
            else:
                retry.append(item)
                self.stats.retries += 1
        if retry:
            # Grows with store refusals too. A Deferred message's attempts do not grow while
            # it waits: the backoff follows the messages that failed (it starts at one).
            tried = [item.attempts for item in retry if not isinstance(item.error, Deferred)]
            first = max(1, min(tried or [item.attempts for item in retry]))
            waits.append(doubling_s(cfg.retry_backoff_s, first, cfg.retry_backoff_max_s))
        busy, batch.busy = batch.busy, []
        lease_left_ms, batch.lease_left_ms = batch.lease_left_ms, []
        busy_wait = BusyWait(batch.busy_until)
        if busy and busy_wait.over():
            self.stats.busy_skipped += len(busy)
        elif busy:
            self.stats.busy_waits += 1
            retry += busy
            batch.busy_rounds += 1
            step_s = doubling_s(cfg.retry_backoff_s, batch.busy_rounds, cfg.retry_backoff_max_s)
            # A duplicate of a message handled in this very batch is DONE at once: no wait.
            waits.append(0.0 if handled_any else busy_wait.next_s(step_s, lease_left_ms))
        return retry, min(waits, default=0.0)

    def _expired(self, msg: Message, envelope: Envelope) -> None:
        self.stats.expired += 1
        if self.config.expired_to_dead_letter:
            self._dead.route(msg, reason=DeadLetterReason.EXPIRED, error_type="Expired",
                             error=f"expired at {envelope.expires_at_ms}",
                             message_id=envelope.id)

    def _partial(self, item: Inbound, detail: str) -> None:
        """Dead-letter a message whose effects were partially applied (its key says "p"): it is
        never handled again; if its dead letter is lost to a rewind or a crash, the re-read
        finds the key PARTIAL (ours) and dead-letters it again."""
        self.stats.partial_effects += 1
        log.error("message %s: Redis effects partially applied, marked done and dead-lettered; "
                  "repair by hand: %s", item.envelope.id, detail)
        self._dead.route(item.msg, reason=DeadLetterReason.PARTIAL_EFFECTS,
                         error_type="PartialEffects", error=detail, attempts=item.attempts,
                         message_id=item.envelope.id)

    def _dead_letter_failed(self, item: Inbound) -> None:
        error = item.error
        log.warning("message %s failed %d times, dead-lettered: %r", item.envelope.id,
                    item.attempts, error)
        self._dead.route(item.msg, reason=DeadLetterReason.HANDLER_FAILED,
                         error_type=type(error).__name__, error=str(error),
                         attempts=item.attempts, message_id=item.envelope.id)
