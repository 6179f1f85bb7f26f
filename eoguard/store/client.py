"""The Redis client eoguard consumes: a Protocol, so users may inject their own; and
:func:`connect`, the one place eoguard builds a client from a URL.

A redis-py ``Redis`` (TLS, ACL user, sentinel-managed) or ``RedisCluster`` satisfies it. It
must return bytes (``decode_responses=False``): outbox records hold binary Avro values.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import redis
from redis.cluster import RedisCluster
from redis.exceptions import OutOfMemoryError

from eoguard.credentials import redis_login
from eoguard.errors import (
    StoreError,
    StoreOutOfMemoryError,
    StoreSecurityError,
    StoreUnavailableError,
)


class RedisClient(Protocol):
    """The subset of redis-py's client API the store layer calls."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any: ...

    def script_load(self, script: Any) -> Any: ...

    def scan_iter(self, match: Any = None, count: Any = None, _type: Any = None,
                  **kwargs: Any) -> Any: ...

    def close(self) -> None: ...


def reply_text(value: object) -> str:
    """A Redis reply as text: bytes decoded (UTF-8), anything else as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def wrap_redis_error(exc: Exception, doing: str) -> StoreError:
    """The eoguard error for a redis-py exception; raise it ``from exc``.

    Connection, timeout and "loading the AOF" errors mean Redis cannot be used right now
    (:class:`StoreUnavailableError`); a refused login or an untrusted TLS certificate is
    its kind :class:`StoreSecurityError`; a full Redis (``OOM``, maxmemory reached
    under noeviction, also when a script's write hits it) is :class:`StoreOutOfMemoryError`;
    anything else is a refusal.
    """
    security = security_reason(exc)
    if security == "credentials":
        return StoreSecurityError(f"Redis refused the login while {doing}: {exc}",
                                  reason=security)
    if security == "certificate":
        return StoreSecurityError(f"Redis's TLS certificate is not trusted (ssl_ca_certs) "
                                  f"while {doing}: {exc}", reason=security)
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return StoreUnavailableError(f"Redis is unreachable while {doing}: {exc}")
    if isinstance(exc, OutOfMemoryError) or out_of_memory(str(exc)):
        return StoreOutOfMemoryError(f"Redis is out of memory (maxmemory) while {doing}: {exc}")
    return StoreError(f"Redis refused {doing}: {exc}")


def out_of_memory(reply: str) -> bool:
    """Whether a Redis error reply (or a script's reason quoting one) says Redis is full:
    maxmemory reached under noeviction, a store outage rather than a bad command."""
    return "OOM command not allowed" in reply


def security_reason(exc: BaseException) -> str | None:
    """``"credentials"`` for a refused login, ``"certificate"`` for a TLS certificate the
    client does not trust, else None (a redis-py exception)."""
    if isinstance(exc, redis.AuthenticationError) or (
            isinstance(exc, redis.ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))):
        return "credentials"
    if isinstance(exc, redis.ConnectionError) and (
            isinstance(exc.__context__, ssl.SSLCertVerificationError)
            or "CERTIFICATE_VERIFY_FAILED" in str(exc)):
        return "certificate"
    return None


def connect(url: str, *, cluster: bool | None = None, **options: Any) -> RedisClient:
    """A redis-py client for ``url``: a ``RedisCluster`` when the server runs in cluster mode.

    ``cluster=None`` asks the server (``INFO cluster``, one round trip on the connection the
    single-node client then keeps); True or False skips the question. ``options`` go to
    redis-py (timeouts, ``username``, ``password``, TLS). Without a password in ``url`` or
    ``options``, the login comes from the environment (:func:`eoguard.credentials.redis_login`).
    Raises ``ValueError``/``TypeError`` for a bad URL, :class:`StoreUnavailableError` when the
    question gets no answer.
    """
    options = {**redis_login(url, options.get("username"), options.get("password")), **options}
    if not cluster:
        client: redis.Redis = redis.Redis.from_url(url, **options)
        if cluster is False or not cluster_mode(client):
            return client
        client.close()
    return RedisCluster.from_url(url, **options)


def cluster_mode(client: RedisClient) -> bool:
    """Whether the server behind a single-node client runs in cluster mode.

    ``INFO cluster`` says so; where an ACL refuses INFO, ``CLUSTER INFO`` does (a server
    without cluster support refuses it). Neither allowed: False, and scripts over several
    slots would fail CROSSSLOT; then pass ``RedisConfig(cluster=True)``.
    """
    for ask in (_info_cluster, _cluster_info):
        pipe = client.pipeline(transaction=False)
        ask(pipe)
        try:
            [reply] = pipe.execute()
        except redis.ResponseError as exc:
            if "cluster support disabled" in str(exc):
                return False
            continue
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "asking whether Redis runs in cluster mode") from exc
        if isinstance(reply, dict):
            return bool(int(reply.get("cluster_enabled", 0)))
        return True  # CLUSTER INFO answered: cluster mode
    return False


def _info_cluster(pipe: Any) -> None:
    pipe.info("cluster")


def _cluster_info(pipe: Any) -> None:
    pipe.execute_command("CLUSTER INFO")
