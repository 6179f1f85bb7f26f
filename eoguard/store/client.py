"""The Redis client eoguard consumes: a Protocol, so users may inject their own.

A redis-py ``Redis`` (TLS, ACL user, sentinel-managed) satisfies it. It must return bytes
(``decode_responses=False``): outbox records hold binary Avro values.
"""

from __future__ import annotations

from typing import Any, Protocol

import redis

from eoguard.errors import StoreError, StoreUnavailableError


class RedisClient(Protocol):
    """The subset of redis-py's client API the store layer calls."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any: ...

    def script_load(self, script: Any) -> Any: ...

    def scan_iter(self, match: Any = None, count: Any = None, _type: Any = None,
                  **kwargs: Any) -> Any: ...

    def close(self) -> None: ...


def wrap_redis_error(exc: Exception, doing: str) -> StoreError:
    """The eoguard error for a redis-py exception; raise it ``from exc``.

    Connection, timeout, authentication and "loading the AOF" errors mean Redis cannot be
    used right now (:class:`StoreUnavailableError`); anything else is a refusal.
    """
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return StoreUnavailableError(f"Redis is unreachable while {doing}: {exc}")
    return StoreError(f"Redis refused {doing}: {exc}")
