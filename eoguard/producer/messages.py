"""What ``send`` returns and what the producer keeps per message while it is in memory.

A message's :class:`Stage` is changed by :class:`eoguard.producer.ledger.Ledger` only (the
state table is in its docstring); its handle's :class:`MessageState` follows from it.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eoguard.codec.rules import InputLimits, header_bytes
from eoguard.envelope import canonical_id
from eoguard.errors import EoguardError, InvalidMessageError, StateError
from eoguard.modes import PersistenceMode

__all__ = [
    "Counters",
    "FailedCallback",
    "GuaranteedCallback",
    "MessageState",
    "PendingMessage",
    "ProducerStats",
    "ReportSink",
    "SendHandle",
    "Stage",
    "StageError",
    "caller_message_id",
    "check_send_args",
]

GuaranteedCallback = Callable[["SendHandle"], None]
ReportSink = Callable[[tuple[Any, Any, Any]], None]
"""Where delivery callbacks put ``(token, err, msg)`` for the poll thread to settle."""
FailedCallback = Callable[["SendHandle", EoguardError], None]


def check_send_args(topic: object, value: object, key: object, *, schema: str | None,
                    headers: Mapping[str, str] | None, ttl_s: object,
                    max_ttl_ms: int, limits: InputLimits) -> bytes | None:
    """Refuse invalid ``send`` arguments with :class:`InvalidMessageError`; the key as bytes.

    What a consumer would refuse as malformed (:mod:`eoguard.codec.rules`) is refused here:
    a TTL beyond ``max_ttl_ms``, headers beyond ``limits`` (a caller's id:
    :func:`caller_message_id`).
    """
    if (topic.__class__ is str and topic and ttl_s is None and headers is None
            and (key is None or key.__class__ is bytes)
            and (schema is not None or value.__class__ is bytes)):
        return key  # the common case, checked at once
    if not isinstance(topic, str) or not topic:
        raise InvalidMessageError(f"topic must be a non-empty string, got {topic!r}")
    if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
                              or not math.isfinite(ttl_s) or ttl_s <= 0):
        raise InvalidMessageError(f"ttl_s must be a positive finite number, got {ttl_s!r}")
    if ttl_s is not None and ttl_s * 1000 > max_ttl_ms:
        raise InvalidMessageError(f"ttl_s {ttl_s} exceeds the key prefix's max_ttl_ms "
                                  f"({max_ttl_ms}): consumers would refuse the message")
    if headers is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise InvalidMessageError("headers must map str to str")
        size = header_bytes(dict(headers))
        if len(headers) > limits.header_count or size > limits.header_bytes:
            raise InvalidMessageError(
                f"{len(headers)} headers of {size} bytes exceed input_limits "
                f"({limits.header_count} headers, {limits.header_bytes} bytes)")
    if schema is None and not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidMessageError(
            f"value must be bytes when no schema is given, got {type(value).__name__}")
    if isinstance(key, str):
        return key.encode()
    if key is not None and not isinstance(key, bytes):
        raise InvalidMessageError(f"key must be bytes, str or None, got {type(key).__name__}")
    return key


def caller_message_id(message_id: object) -> str:
    """A caller's ``message_id`` as canonical UUID text; :class:`InvalidMessageError` for
    anything that is not a UUID (a consumer would refuse it as malformed)."""
    mid = canonical_id(message_id) if isinstance(message_id, str) else None
    if mid is None:
        raise InvalidMessageError(f"message_id must be a UUID, got {message_id!r}")
    return mid


class MessageState(enum.Enum):
    """A sent message's lifecycle as the application sees it.

    ``ACCEPTED`` -> ``GUARANTEED`` (in the outbox, or acknowledged by Kafka with acks=all) or
    ``ACCEPTED`` -> ``FAILED`` (never both, each at most once).
    """

    ACCEPTED = "accepted"
    GUARANTEED = "guaranteed"
    FAILED = "failed"


class Stage(enum.Enum):
    """Where one message is while the producer holds it; the ledger's docstring has the
    table of what each stage means (acknowledged, written, holding room) and its transitions.

    Persist-first goes QUEUED -> WRITING -> STORED -> PRODUCED -> PUBLISHED; delayed goes
    SENT -> ACKED, or SENT -> SENT_WRITING -> PERSISTED -> PUBLISHED.
    """

    NEW = "new"  # built by send, holding no room yet
    # persist-first: not handed to librdkafka before it is in the outbox
    QUEUED = "queued"  # waits for its outbox write
    WRITING = "writing"  # its outbox write is in flight
    REQUEUED = "requeued"  # that write failed (it may have landed): waits to be written again
    REWRITING = "rewriting"  # written again
    STORED = "stored"  # in the outbox: the flusher hands it to librdkafka
    ACKED_STORED = "acked_stored"  # acknowledged before the flusher saw librdkafka take it
    PRODUCED = "produced"  # in the outbox and handed to librdkafka
    FOUND = "found"  # its id's record was in the outbox already: guaranteed by it, not produced
    # delayed: handed to librdkafka at send
    SENT = "sent"  # waits for Kafka's ack or the end of its delay
    SENT_WRITING = "sent_writing"  # delay over, unacknowledged: its outbox write in flight
    SENT_REQUEUED = "sent_requeued"  # that write failed (it may have landed)
    SENT_REWRITING = "sent_rewriting"
    ACKED_WRITING = "acked_writing"  # acknowledged while its write was in flight
    ACKED_REWRITING = "acked_rewriting"
    PERSISTED = "persisted"  # in the outbox: waits for Kafka's ack
    ACKED = "acked"  # acknowledged, no write of it known to have landed: nothing to mark
    WITHDRAWN = "withdrawn"  # librdkafka refused it at send: send raised, never sent
    # both modes
    PUBLISHED = "published"  # in the outbox and acknowledged: its publish mark is queued
    FAILED = "failed"  # on_failed fired: expired, refused by Kafka, or the producer closed


_NEW = Stage.NEW  # an Enum class attribute costs ~0.2 us on Python 3.11: once per send here


class SendHandle:
    """The message id of one ``send`` and, later, whether it was guaranteed."""

    __slots__ = ("_done", "error", "expires_at_ms", "id", "state", "topic")

    def __init__(self, message_id: str, topic: str, expires_at_ms: int,
                 done: threading.Condition) -> None:
        self.id = message_id
        self.topic = topic
        self.expires_at_ms = expires_at_ms
        self.state = MessageState.ACCEPTED
        self.error: EoguardError | None = None
        self._done = done

    @property
    def guaranteed(self) -> bool:
        return self.state is MessageState.GUARANTEED

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the message is guaranteed or failed; True when guaranteed."""
        with self._done:
            self._done.wait_for(lambda: self.state is not MessageState.ACCEPTED, timeout_s)
        return self.state is MessageState.GUARANTEED

    def __repr__(self) -> str:
        return f"SendHandle(id={self.id!r}, topic={self.topic!r}, state={self.state.value})"


class PendingMessage(SendHandle):
    """One sent message: the handle ``send`` returns, and what the producer keeps of the
    message while it holds it in memory (the in-memory log queue's entry).

    One object per message, not two: the hot path allocates (and the garbage collector
    tracks) less. It carries what :meth:`eoguard.store.outbox.Outbox.put` reads of an outbox
    entry (``id``, ``topic``, ``key``, ``value``, ``headers``, ``headers_json``, ``attempt``,
    ``created_at_ms``, ``expires_at_ms``), so a batch is written without a copy per message.
    Its ``value`` is dropped once its room in the queue is released (no longer needed), so
    an application keeping handles keeps no payloads. ``stage`` and the handle's ``state``
    are the ledger's to change.
    """

    __slots__ = ("created_at_ms", "created_mono", "headers", "headers_json", "key",
                 "on_failed", "on_guaranteed", "sink", "size", "stage", "value")

    attempt: int = 1

    def __init__(self, message_id: str, topic: str, expires_at_ms: int,
                 done: threading.Condition, *, key: bytes | None, value: bytes,
                 created_at_ms: int, created_mono: float,
                 on_guaranteed: GuaranteedCallback | None, on_failed: FailedCallback | None,
                 sink: ReportSink, headers: Mapping[str, str] | None = None,
                 headers_json: bytes | None = None) -> None:
        # SendHandle's fields, set here (one call less per message).
        self.id = message_id
        self.topic = topic
        self.expires_at_ms = expires_at_ms
        self.state = MessageState.ACCEPTED
        self.error = None
        self._done = done
        self.key = key
        self.value = value
        self.headers = headers  # Kafka record headers: the header wire format's, else None
        self.headers_json = headers_json  # their JSON in the outbox record, made by send
        self.size = len(value) + (len(key) if key else 0)
        self.created_at_ms = created_at_ms
        self.created_mono = created_mono
        self.on_guaranteed = on_guaranteed
        self.on_failed = on_failed
        self.sink = sink
        self.stage = _NEW

    def delivered(self, err: object, msg: object) -> None:
        """librdkafka's delivery callback: hand the report to the producer's report queue."""
        self.sink((self, err, msg))


class StageError(StateError):
    """A stage transition the ledger's table forbids: a bug in eoguard, never the caller's."""

    def __init__(self, msg: PendingMessage, event: str) -> None:
        super().__init__(f"message {msg.id}: no {event!r} from stage {msg.stage.value}")
        self.message_id = msg.id
        self.stage = msg.stage
        self.event = event


@dataclass(slots=True)
class Counters:
    """A producer's mutable counters, changed by its ledger only (under the ledger's lock)."""

    sent: int = 0
    guaranteed: int = 0
    failed: int = 0
    persisted: int = 0
    published: int = 0
    resent: int = 0
    expired: int = 0
    delivery_failures: int = 0
    redis_writes_avoided: int = 0
    already_in_outbox: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerStats:
    """Counters since start, and the current adaptive-delay inputs."""

    mode: PersistenceMode
    sent: int
    guaranteed: int
    failed: int
    persisted: int  # outbox records written
    published: int  # Kafka acknowledgements (first sends and resends)
    resent: int
    expired: int  # expired before guaranteed, or found expired by recovery
    delivery_failures: int
    redis_writes_avoided: int  # delayed mode: acknowledged by Kafka within the delay
    already_in_outbox: int  # a caller's id whose record was there already: not stored again
    current_delay_ms: float
    queue_depth: int
    queue_bytes: int
    ack_latency_p50_ms: float | None
    ack_latency_p99_ms: float | None
    live_producers: int
    store_available: bool
