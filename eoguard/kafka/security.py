"""Refused logins and untrusted certificates, told apart from a broker that is merely down.

librdkafka reports both through its error callback only (a producer's records then wait
for their delivery timeout; a consumer's ``consume`` returns nothing): :class:`SecurityWatch`
is that callback, and keeps the last such error as a :class:`BrokerSecurityError` for the
wrapper to raise. :func:`client_config` is the one place a librdkafka configuration gets it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError

from eoguard.credentials import kafka_login
from eoguard.errors import BrokerSecurityError

log = logging.getLogger(__name__)

_REASONS = {KafkaError._AUTHENTICATION: "credentials", KafkaError._SSL: "certificate"}
_WHAT = {"credentials": "Kafka refused the SASL login (sasl.username/sasl.password)",
         "certificate": "the TLS handshake with Kafka failed (is the broker's certificate "
                        "signed by the CA in ssl.ca.location?)"}


class SecurityWatch:
    """librdkafka's ``error_cb``: remembers the last refused login or TLS handshake, then
    calls the application's own ``error_cb``, if it gave one."""

    def __init__(self, chained: Callable[[KafkaError], None] | None = None) -> None:
        self._chained = chained
        self._lock = threading.Lock()
        self._error: BrokerSecurityError | None = None

    def __call__(self, err: KafkaError) -> None:
        reason = _REASONS.get(err.code())
        if reason is not None:
            text = " ".join(str(err.str()).split())
            error = BrokerSecurityError(f"{_WHAT[reason]}: {text}", reason=reason)
            with self._lock:
                first, self._error = self._error is None, error
            if first:
                log.warning("%s", error)
        if self._chained is not None:
            self._chained(err)
        elif reason is None:
            # What librdkafka logs itself when no error_cb is set (it retries these).
            log.info("librdkafka: %s", err.str())

    def seen(self) -> bool:
        """Whether an error is kept (:meth:`take` would return it)."""
        return self._error is not None

    def take(self) -> BrokerSecurityError | None:
        """The error seen since the last call (and forget it), or None."""
        with self._lock:
            error, self._error = self._error, None
        return error


def client_config(conf: Mapping[str, Any]) -> tuple[dict[str, Any], SecurityWatch]:
    """``conf`` with SASL credentials from the environment where it lacks them
    (:func:`eoguard.credentials.kafka_login`) and a :class:`SecurityWatch` as ``error_cb``."""
    out = kafka_login(conf)
    watch = SecurityWatch(out.get("error_cb"))
    out["error_cb"] = watch
    return out, watch
