"""Dead-letter routing: a poisoned record goes, byte for byte, to the scope's dead-letter topic.

The record keeps its key, value and headers; eoguard adds headers saying why and from where:

    eoguard.error.kind       why (DeadLetterReason): malformed, handler-failed, expired,
                             partial-effects
    eoguard.error.type       the error class (e.g. BadMagicError, ValueError, Expired)
    eoguard.error.reason     the error text (truncated to 1 kB)
    eoguard.error.attempts   handler attempts made (0 when it never reached the handler)
    eoguard.source.topic / eoguard.source.partition / eoguard.source.offset
    eoguard.scope            the consumer scope that gave up on it
    eoguard.message.id       the envelope id, when the record decoded

Header text is encoded as UTF-8 with ``backslashreplace``: a reason quoting a hostile record
(a lone surrogate from its JSON) is sent escaped, never refused (:func:`_encoded`).

The consumer flushes the dead letters of a batch before it commits past them; a record that
cannot be dead-lettered keeps its offset uncommitted (DeadLetterError).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Message

from eoguard.codec.headers import RawHeaders
from eoguard.errors import BrokerError, DeadLetterError
from eoguard.kafka.sink import DeliverySink

_MAX_REASON = 1024

KIND = "eoguard.error.kind"
ERROR_TYPE = "eoguard.error.type"
REASON = "eoguard.error.reason"
ATTEMPTS = "eoguard.error.attempts"
SOURCE_TOPIC = "eoguard.source.topic"
SOURCE_PARTITION = "eoguard.source.partition"
SOURCE_OFFSET = "eoguard.source.offset"
SCOPE = "eoguard.scope"
MESSAGE_ID = "eoguard.message.id"
ADDED = (KIND, ERROR_TYPE, REASON, ATTEMPTS, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET,
         SCOPE, MESSAGE_ID)
"""The headers :meth:`DeadLetterRouter.route` adds to a record (module docstring)."""


def _encoded(text: str) -> bytes:
    """A header value's bytes: UTF-8, with what UTF-8 cannot hold (a lone surrogate quoted
    from a hostile record) as a backslash escape; never raises (the one place header text
    is encoded)."""
    return text.encode("utf-8", "backslashreplace")


class DeadLetterReason(enum.Enum):
    """Why a record was dead-lettered (the outcome, not the error class)."""

    MALFORMED = "malformed"  # did not decode: envelope or payload
    HANDLER_FAILED = "handler-failed"  # failed past the retry budget
    EXPIRED = "expired"  # reached the scope after expires_at (when so configured)
    PARTIAL_EFFECTS = "partial-effects"  # some Redis effects applied, then one failed: done


class DeadLetterRouter:
    """Sends poisoned records to one dead-letter topic."""

    def __init__(self, sink: DeliverySink, *, topic: str, scope: str) -> None:
        self._sink = sink
        self.topic = topic
        self.scope = scope
        self.routed = 0

    def route(self, msg: Message, *, reason: DeadLetterReason, error_type: str, error: str,
              attempts: int = 0, message_id: str | None = None) -> None:
        """Queue ``msg`` for the dead-letter topic (sent for good by :meth:`flush`)."""
        headers: list[tuple[str, bytes]] = []
        for item in msg.headers() or []:
            if isinstance(item, tuple) and item[1] is not None:
                value = item[1]
                headers.append((str(item[0]), value if isinstance(value, bytes)
                                else _encoded(str(value))))
        extra = {
            KIND: reason.value,
            ERROR_TYPE: error_type,
            REASON: error[:_MAX_REASON],
            ATTEMPTS: str(attempts),
            SOURCE_TOPIC: msg.topic() or "",
            SOURCE_PARTITION: str(msg.partition()),
            SOURCE_OFFSET: str(msg.offset()),
            SCOPE: self.scope,
        }
        if message_id is not None:
            extra[MESSAGE_ID] = message_id
        headers += [(k, _encoded(v)) for k, v in extra.items()]
        try:
            self._sink.produce(self.topic, msg.value(), msg.key(), headers)
        except BrokerError as exc:
            raise DeadLetterError(f"cannot dead-letter {msg.topic()}[{msg.partition()}]@"
                                  f"{msg.offset()}: {exc}") from exc
        self.routed += 1

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until Kafka has every queued dead letter."""
        try:
            self._sink.flush(timeout_s)
        except BrokerError as exc:
            raise DeadLetterError(f"dead letters not delivered to {self.topic}: {exc}") from exc


@dataclass(frozen=True)
class DeadLetter:
    """A dead-letter record read back: the original record (its headers without the ones
    :meth:`DeadLetterRouter.route` added) and what those added headers say (as text; ``""``
    for one that is missing, as in a record some other tool wrote)."""

    headers: list[tuple[str, bytes]]  # the original record's, in order (a name may repeat)
    added: dict[str, str]

    @classmethod
    def split(cls, raw: RawHeaders | None) -> DeadLetter:
        """The record's headers split into the original's and eoguard's additions (the last
        value of an added name wins: a record dead-lettered twice says why the last time)."""
        original: list[tuple[str, bytes]] = []
        added: dict[str, str] = {}
        pairs = raw.items() if isinstance(raw, Mapping) else raw or ()
        for name, value in pairs:
            data = value.encode() if isinstance(value, str) else value
            if name in ADDED:
                added[name] = (data or b"").decode("utf-8", "replace")
            elif data is not None:
                original.append((name, data))
        return cls(original, added)

    @property
    def kind(self) -> str:
        return self.added.get(KIND, "")

    @property
    def source_topic(self) -> str:
        return self.added.get(SOURCE_TOPIC, "")
