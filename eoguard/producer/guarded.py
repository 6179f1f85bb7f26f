"""GuardedProducer: Kafka producing with a Redis outbox, guaranteed callbacks and recovery.

``send`` encodes the message as an Avro envelope, or in the header wire format (the value a
Schema Registry serializer writes, eoguard's fields as headers; ``ProducerConfig.wire_format``)
(new time-ordered id, ``expires_at = now + ttl``, at most Redis's now + ``max_ttl``), takes
room in the bounded in-memory queue and
returns a :class:`SendHandle` without waiting on the network. ``on_guaranteed`` fires
exactly once, when the message is in the Redis outbox or acknowledged by Kafka with
acks=all, whichever comes first (see :class:`eoguard.modes.PersistenceMode` for the two
modes and their trade-off); from then on no crash of this process loses it. ``on_failed``
fires instead when that cannot happen (expired while the outbox was down, refused by Kafka,
producer closed first).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from eoguard.callbacks import require_sync
from eoguard.codec import EnvelopeCodec, PayloadCodec, SchemaRegistry
from eoguard.codec.headers import check_app_headers
from eoguard.config import ProducerConfig
from eoguard.envelope import new_message_id, now_ms
from eoguard.errors import (
    BackpressureError,
    EoguardError,
    InvalidMessageError,
    MessageTooLargeError,
    PersistError,
    ProducerClosedError,
)
from eoguard.kafka.producer import KafkaProducer
from eoguard.modes import PersistenceMode, WireFormat
from eoguard.producer.callbacks import CallbackDispatcher
from eoguard.producer.engine import ProducerEngine
from eoguard.producer.ledger import Ledger
from eoguard.producer.messages import (
    FailedCallback,
    GuaranteedCallback,
    PendingMessage,
    ProducerStats,
    SendHandle,
    caller_message_id,
    check_send_args,
)
from eoguard.producer.record_headers import RecordHeaders
from eoguard.producer.recovery import Recovery, RecoveryReport
from eoguard.store.layout import check_layout
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox
from eoguard.store.scripts import Scripts

__all__ = ["GuardedProducer"]

log = logging.getLogger(__name__)

_NO_HEADERS: dict[str, str] = {}  # shared, never written to


class GuardedProducer:
    """A Kafka producer whose guaranteed messages survive its own crash (see module doc).

    Construction registers the instance's liveness lease in Redis and, with
    ``recover_on_start``, resends what crashed producers left behind; it raises
    :class:`StoreUnavailableError` if Redis cannot be reached then, and
    :class:`ConfigError` for an ``async def`` callback (eoguard never awaits one).
    """

    def __init__(self, config: ProducerConfig, *, registry: SchemaRegistry | None = None,
                 on_guaranteed: GuaranteedCallback | None = None,
                 on_failed: FailedCallback | None = None) -> None:
        require_sync(on_guaranteed, "on_guaranteed")  # before any connection: nothing to close
        require_sync(on_failed, "on_failed")
        self.config = config
        self.instance_id = config.instance_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self._on_guaranteed = on_guaranteed
        self._on_failed = on_failed
        registry = registry or SchemaRegistry.default()
        self._codec = EnvelopeCodec(registry)
        self._payloads = PayloadCodec(registry)
        self._headers_format = config.wire_format is WireFormat.HEADERS
        self._record_headers = RecordHeaders(
            producer=self.instance_id, source=config.event_source,
            limits=config.input_limits) if self._headers_format else None
        self._framed = (config.schema_registry.payloads(registry)
                        if self._headers_format and config.schema_registry is not None else None)
        self._ttl_ms = int(config.default_ttl_s * 1000)
        self._max_ttl_ms = config.keyspace.max_ttl_ms
        self._payload_limit = config.input_limits.payload_bytes
        self._delayed = config.mode is PersistenceMode.DELAYED
        self._closed = False
        self._sends = 0
        self._done = threading.Condition()
        self._redis = config.redis.connect()
        self._kafka = KafkaProducer(config.kafka_config())
        # Replicated durability: outbox writes on a replica before on_guaranteed fires.
        wait = config.redis.replica_wait()
        scripts = Scripts(self._redis, wait=wait)
        self._outbox = Outbox(self._redis, config.keyspace, scripts=scripts)
        self._liveness = Liveness(self._redis, config.keyspace, scripts=scripts)
        reports: collections.deque[tuple[Any, Any, Any]] = collections.deque()
        self._sink = reports.append
        self._recovery = Recovery(outbox=self._outbox, liveness=self._liveness, codec=self._codec,
                                  kafka=self._kafka, instance_id=self.instance_id,
                                  resend_after_ms=config.resend_after_ms, sink=self._sink,
                                  produce_timeout_s=config.send_timeout_s)
        self._dispatcher = CallbackDispatcher(self._done)
        self._ledger = Ledger(delayed=self._delayed, max_messages=config.max_queue_messages,
                              max_bytes=config.max_queue_bytes, dispatcher=self._dispatcher)
        self._engine = ProducerEngine(config=config, instance_id=self.instance_id,
                                      ledger=self._ledger, kafka=self._kafka,
                                      outbox=self._outbox, liveness=self._liveness,
                                      recovery=self._recovery, reports=reports)
        try:
            check_layout(self._redis, config.keyspace, replicas=wait.replicas if wait else 0)
            # Register before writing any record: a recovering producer treats records of an
            # owner it does not see live (and older than its read) as abandoned.
            self._engine.renew_lease()
            if config.recover_on_start:
                self.recover()
        except EoguardError:
            self._dispatcher.close()
            self._kafka.close()
            if self._framed is not None:
                self._framed.close()
            if config.redis.client is None:
                self._redis.close()
            raise
        if config.default_ttl_s * 1000 <= config.resend_after_ms:
            log.warning("default_ttl_s (%.0f s) is not above resend_after (%.0f s): a message "
                        "whose first delivery fails expires before recovery may resend it "
                        "(docs/design.md §5)", config.default_ttl_s,
                        config.resend_after_ms / 1000)
        self._engine.start()

    # Sending ---------------------------------------------------------------------------
    def send(self, topic: str, value: Any, key: bytes | str | None = None, *,
             ttl_s: float | None = None, schema: str | None = None,
             headers: Mapping[str, str] | None = None, message_id: str | None = None,
             on_guaranteed: GuaranteedCallback | None = None,
             on_failed: FailedCallback | None = None) -> SendHandle:
        """Send one message; returns at once with its handle (blocks only when the queue is full).

        ``value`` is bytes (``schema=None``) or an object encoded with the Avro schema named
        ``schema``. ``message_id`` is the caller's own id (a UUID, for example from
        :func:`eoguard.message_id_for`), so a send repeated after the application's own crash
        is the same message to every consumer scope; persist-first does not publish it again
        while the first send's record is in the outbox (its ``on_guaranteed`` fires at once).
        Raises :class:`InvalidMessageError` (also for a TTL beyond the key prefix's
        ``max_ttl_ms``, headers or payload beyond ``input_limits``, or an async callback),
        :class:`MessageTooLargeError`, :class:`SchemaNotFoundError` /
        :class:`PayloadEncodeError`; in the header wire format also
        :class:`ReservedHeaderError` (a header eoguard writes), :class:`SchemaRefusedError`
        and :class:`RegistryUnavailableError` (the first send of a schema to a topic asks
        Schema Registry for its id); :class:`BackpressureError` (queue full past
        ``send_timeout_s``), :class:`PersistError` (persist-first, queue full because the
        outbox is unreachable) or :class:`ProducerClosedError`.
        """
        if self._closed:
            raise ProducerClosedError("send after close")
        if on_guaranteed is not None or on_failed is not None:
            require_sync(on_guaranteed, "on_guaranteed", error=InvalidMessageError)
            require_sync(on_failed, "on_failed", error=InvalidMessageError)
        msg = self._message(topic, value, key, ttl_s=ttl_s, schema=schema, headers=headers,
                            message_id=message_id,
                            on_guaranteed=on_guaranteed or self._on_guaranteed,
                            on_failed=on_failed or self._on_failed)
        self._admit(msg, wait=True)
        return msg

    # The two halves of send, also the async front's (eoguard.producer.aio) -------------
    def _message(self, topic: str, value: Any, key: bytes | str | None, *,
                 ttl_s: float | None, schema: str | None, headers: Mapping[str, str] | None,
                 message_id: str | None, on_guaranteed: GuaranteedCallback | None,
                 on_failed: FailedCallback | None) -> PendingMessage:
        """The checked, encoded message of a ``send`` (its errors but the queue's), not yet
        holding room."""
        key = check_send_args(topic, value, key, schema=schema, headers=headers, ttl_s=ttl_s,
                              max_ttl_ms=self._max_ttl_ms, limits=self.config.input_limits)
        mid = new_message_id() if message_id is None else caller_message_id(message_id)
        ttl_ms = self._ttl_ms if ttl_s is None else max(1, int(ttl_s * 1000))
        if self._headers_format:
            payload = self._framed_payload(topic, value, schema, headers)
        else:
            payload = (value if schema is None and value.__class__ is bytes
                       else self._payloads.encode(value, schema))
        if len(payload) > self._payload_limit:
            raise InvalidMessageError(f"payload of {len(payload)} bytes is over "
                                      f"input_limits.payload_bytes ({self._payload_limit})")
        created = now_ms()
        expires = created + ttl_ms
        bound = created - self._engine.clock_ahead_ms + self._max_ttl_ms
        if expires > bound:  # never past max_ttl by Redis's clock (docs/design.md §5, Clocks)
            expires = bound
            created = min(created, bound)  # a clock ahead by over max_ttl: never after expiry
        record_headers, head_size, head_json = None, 0, None
        if self._record_headers is not None:  # the value is the payload; the fields headers
            data = payload
            record_headers, head_size, head_json = self._record_headers.write(
                mid, created, expires, schema, headers)
        else:
            data = self._codec.encode_fields(  # the envelope, encoded without building it
                mid, expires, created, producer=self.instance_id, attempt=1,
                payload_schema=schema, payload=payload,
                headers=dict(headers) if headers else _NO_HEADERS,
                payload_fingerprint=None if schema is None
                else self._payloads.writer_fingerprint(schema))
        size = len(data) + (len(key) if key else 0) + head_size
        if size > self.config.max_message_bytes:
            raise MessageTooLargeError(
                f"message of {size} bytes exceeds max_message_bytes "
                f"({self.config.max_message_bytes})", size=size, limit=self.config.max_message_bytes)
        return PendingMessage(mid, topic, expires, self._done, key=key, value=data,
                              created_at_ms=created, created_mono=time.monotonic(),
                              on_guaranteed=on_guaranteed, on_failed=on_failed,
                              sink=self._sink, headers=record_headers,
                              headers_json=head_json)

    def _admit(self, msg: PendingMessage, *, wait: bool) -> None:
        """Give ``msg`` room in the queue and line it up (delayed: hand it to librdkafka).

        ``wait``: block up to ``send_timeout_s`` while the queue (or librdkafka's) is full;
        else raise the full queue's error at once (the async front never blocks its loop).
        """
        if wait:
            self._ledger.send(msg, self.config.send_timeout_s, self._full_error,
                              self._produce_now)
        else:
            self._ledger.send(msg, 0.0, self._full_error, self._produce_at_once)
        self._sends += 1
        if not self._sends & 127:
            self._engine.serve_deliveries()

    def _registry_call(self, topic: str, schema: str | None) -> Callable[[], object] | None:
        """The Schema Registry call the next send of ``schema`` to ``topic`` would make (the
        header wire format, a schema's first send to a topic), for the async front to run
        off its event loop; None when no call is due."""
        framed = self._framed
        if schema is None or framed is None or framed.knows(schema, topic=topic):
            return None
        return functools.partial(framed.schema_id, schema, topic=topic)

    def _framed_payload(self, topic: str, value: Any, schema: str | None,
                        headers: Mapping[str, str] | None) -> bytes:
        """The header format's record value: the payload framed for Schema Registry, or the
        raw bytes (docs/design.md §3, "The header format")."""
        check_app_headers(headers or _NO_HEADERS, raw=schema is None)
        if schema is None:
            return bytes(value)
        if self._framed is None:
            raise InvalidMessageError(f"schema {schema!r} in the header wire format needs "
                                      "ProducerConfig.schema_registry")
        return self._framed.encode(value, schema, topic=topic)

    def _produce_now(self, msg: PendingMessage) -> None:
        """delayed mode: hand the message to librdkafka from the caller's thread, waiting up
        to ``send_timeout_s`` while librdkafka's queue is full (the ledger withdraws it if
        this raises)."""
        deadline = 0.0
        while not self._kafka.produce(msg.topic, msg.value, msg.key, headers=msg.headers,
                                      on_delivery=msg.delivered):
            if not deadline:
                deadline = time.monotonic() + self.config.send_timeout_s
            elif time.monotonic() > deadline:
                raise BackpressureError(
                    f"librdkafka's queue stayed full for {self.config.send_timeout_s} s")
            time.sleep(0.001)

    def _produce_at_once(self, msg: PendingMessage) -> None:
        """delayed mode, not waiting: :class:`BackpressureError` when librdkafka's queue is
        full (the ledger withdraws the message)."""
        if not self._kafka.produce(msg.topic, msg.value, msg.key, headers=msg.headers,
                                   on_delivery=msg.delivered):
            raise BackpressureError("librdkafka's queue is full")

    def _full_error(self) -> EoguardError:
        limits = (f"{self.config.max_queue_messages} messages / "
                  f"{self.config.max_queue_bytes} bytes")
        if self.config.mode is PersistenceMode.PERSIST_FIRST and not self._engine.store_available:
            return PersistError(f"the outbox is unreachable and the queue is full ({limits}); "
                                "nothing was produced unpersisted")
        return BackpressureError(f"the queue stayed full ({limits}) for "
                                 f"{self.config.send_timeout_s} s")

    # Lifecycle -------------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Resend records whose owner is gone or whose delivery timed out; sweep expired ones.

        Runs at start and every ``recover_interval_s``; raises :class:`StoreError` when Redis
        cannot be used.
        """
        report = self._recovery.run()
        self._ledger.count_recovery(report)
        return report

    def resend(self, message_ids: Sequence[str]) -> RecoveryReport:
        """Resend the named pending outbox records now, whoever owns them (the operator's
        ``eoguard outbox resend ID...``); the consumers' dedup drops any duplicate."""
        report = self._recovery.resend_ids(message_ids)
        self._ledger.count_recovery(report)
        return report

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait until every sent message is settled and acknowledged or persisted and every
        record handed to Kafka is delivered; returns how many are still outstanding.

        The calling thread serves the delivery reports while it waits. Raises
        :class:`BrokerSecurityError` instead of returning a count when messages are left and
        Kafka refused the login or its certificate was not trusted since the last flush
        (at once: librdkafka would retry the login until the timeout).
        """
        outstanding = self._settle(timeout_s, until=self._kafka.refusing)
        refused = self._kafka.refused()
        if outstanding and refused is not None:
            raise refused
        return outstanding

    def _settle(self, timeout_s: float | None,
                until: Callable[[], bool] | None = None) -> int:
        """:meth:`flush`'s wait (cut short once ``until()``): how many messages are still
        outstanding after it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            outstanding = self._ledger.outstanding()
            outstanding += len(self._kafka) + len(self._engine.deliveries.reports)
            if outstanding == 0 or (deadline is not None and time.monotonic() >= deadline) \
                    or (until is not None and until()):
                return outstanding
            self._engine.serve_deliveries(0.005)

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush for up to ``timeout_s``, stop, and give the liveness lease up.

        Step 1. Refuse new sends. Step 2. Flush. Step 3. Stop the threads and drop what
        librdkafka still holds (those records are in the outbox: others resend them).
        Step 4. Fail every message never guaranteed. Step 5. Give up the lease.
        """
        if self._closed:
            return
        deadline = time.monotonic() + timeout_s
        # Step 1.
        self._closed = True
        self._ledger.close()
        # Step 2.
        self._settle(timeout_s)
        # Step 3.
        self._engine.stop(max(deadline - time.monotonic(), 1.0))
        self._kafka.close(0)
        self._engine.deliveries.process()
        self._engine.writer.flush_publish_marks()
        self._engine.writer.close()
        # Step 4.
        self._ledger.fail_waiting()
        # Step 5.
        try:
            self._liveness.deregister(self.instance_id)
        except EoguardError as exc:
            log.warning("could not give the liveness lease up: %s", exc)
        self._dispatcher.close(max(deadline - time.monotonic(), 1.0))
        if self._framed is not None:
            self._framed.close()
        if self.config.redis.client is None:
            self._redis.close()

    def __enter__(self) -> GuardedProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # Inspection ------------------------------------------------------------------------
    def stats(self) -> ProducerStats:
        """Counters since start, the current delay and the queue depth."""
        e = self._engine
        p50, p99 = e.deliveries.latency.percentiles(50, 99)
        c, depth, size = self._ledger.snapshot()
        return ProducerStats(
            mode=self.config.mode, sent=c.sent, guaranteed=c.guaranteed, failed=c.failed,
            persisted=c.persisted, published=c.published, resent=c.resent,
            expired=c.expired, delivery_failures=c.delivery_failures,
            redis_writes_avoided=c.redis_writes_avoided,
            already_in_outbox=c.already_in_outbox,
            current_delay_ms=e.delay_ms if e.delayed else 0.0,
            queue_depth=depth, queue_bytes=size,
            ack_latency_p50_ms=p50, ack_latency_p99_ms=p99,
            live_producers=e.live_producers, store_available=e.store_available)

    def __repr__(self) -> str:
        return (f"GuardedProducer(instance_id={self.instance_id!r}, "
                f"mode={self.config.mode.value!r}, closed={self._closed})")
