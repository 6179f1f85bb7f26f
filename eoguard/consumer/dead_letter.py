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

from confluent_kafka import Message

from eoguard.errors import BrokerError, DeadLetterError
from eoguard.kafka.sink import DeliverySink

_MAX_REASON = 1024


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
            "eoguard.error.kind": reason.value,
            "eoguard.error.type": error_type,
            "eoguard.error.reason": error[:_MAX_REASON],
            "eoguard.error.attempts": str(attempts),
            "eoguard.source.topic": msg.topic() or "",
            "eoguard.source.partition": str(msg.partition()),
            "eoguard.source.offset": str(msg.offset()),
            "eoguard.scope": self.scope,
        }
        if message_id is not None:
            extra["eoguard.message.id"] = message_id
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
