"""The key layout a prefix was first used with, recorded in Redis so every process agrees.

The shard count is part of every key name (:mod:`eoguard.store.keys`). Two processes that
disagree on it look for one message under two keys: a consumer handles it twice, recovery
sweeps index entries of records it cannot see and never resends them. So the first process
to use a prefix records its shard count, and every later one checks it at start.
"""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from eoguard.errors import ConfigError
from eoguard.store.client import RedisClient, wrap_redis_error
from eoguard.store.keys import KeySpace


def _layout(client: RedisClient, keys: KeySpace, *, record: bool) -> int | None:
    pipe = client.pipeline(transaction=False)
    if record:
        pipe.hsetnx(keys.layout(), "shards", keys.shards)
    pipe.hget(keys.layout(), "shards")
    try:
        stored = pipe.execute()[-1]
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "reading the key layout") from exc
    return None if stored is None else int(stored)


def recorded_shards(client: RedisClient, prefix: str) -> int | None:
    """The shard count recorded for ``prefix``, or None when no process used it yet."""
    return _layout(client, KeySpace(prefix=prefix), record=False)


def check_layout(client: RedisClient, keys: KeySpace) -> None:
    """Record ``keys.shards`` for the prefix on first use; raise ConfigError if it differs,
    or if a single-node client talks to a server in cluster mode."""
    if not isinstance(client, RedisCluster) and _cluster_enabled(client):
        # A single-node client sends one script call per batch over many hash slots: a
        # cluster answers CROSSSLOT to every one of them.
        raise ConfigError("this Redis runs in cluster mode: pass a redis.cluster.RedisCluster "
                          "client (RedisConfig(client=...))")
    stored = _layout(client, keys, record=True)
    if stored != keys.shards:
        raise ConfigError(
            f"key prefix {keys.prefix!r} is laid out in {stored} shards, but this process "
            f"is configured with {keys.shards}; use shards={stored} (or another prefix)")


def _cluster_enabled(client: RedisClient) -> bool:
    pipe = client.pipeline(transaction=False)
    pipe.info("cluster")
    try:
        [info] = pipe.execute()
    except redis.ResponseError:  # INFO refused (an ACL): the scripts would tell soon enough
        return False
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "reading INFO cluster") from exc
    return bool(int(info.get("cluster_enabled", 0)))
