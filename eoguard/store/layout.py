"""The key layout a prefix was first used with, recorded in Redis so every process agrees;
and the server settings eoguard cannot run safely without.

The layout record (``KeySpace.layout()``, a hash) holds ``shards``, ``version`` and
``max_ttl_ms``. The shard count is part of every key name (:mod:`eoguard.store.keys`): two
processes that disagree on it look for one message under two keys, so a consumer handles it
twice and recovery sweeps index entries of records it cannot see. ``max_ttl_ms`` bounds every
key's TTL; two processes with different bounds would refuse each other's expiries. The version
names the dedup model (:data:`LAYOUT_VERSION`): a v2 process reads none of the keys of layout
version 1 (a record with ``shards`` and no ``version``), so it may take over such a prefix
only once they have all expired, else it would handle again what v1 consumers handled.

The first process to use a prefix records the layout (one optimistic transaction: WATCH,
read, MULTI/EXEC); every later one checks it at start and refuses, with what to do, when it
is configured otherwise. Redis must also run with ``maxmemory-policy noeviction``: an evicted
claim or outbox record is a silent duplicate or a silent loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from eoguard.errors import ConfigError, StoreError
from eoguard.store.client import RedisClient, cluster_mode, reply_text, wrap_redis_error
from eoguard.store.dedup_admin import count_keys
from eoguard.store.keys import LAYOUT_VERSION, KeySpace
from eoguard.store.replicas import check_replicas

log = logging.getLogger(__name__)

_ATTEMPTS = 20  # optimistic transactions lost to concurrent starts before giving up


@dataclass(frozen=True, slots=True)
class Layout:
    """A prefix's layout record as stored (version 1 records hold only ``shards``)."""

    shards: int | None
    version: int
    max_ttl_ms: int | None

    @classmethod
    def parse(cls, fields: dict[Any, Any]) -> Layout:
        text = {reply_text(k): reply_text(v) for k, v in fields.items()}
        shards, version, max_ttl = (text.get(name) for name in ("shards", "version", "max_ttl_ms"))
        return cls(shards=None if shards is None else int(shards),
                   version=1 if version is None else int(version),
                   max_ttl_ms=None if max_ttl is None else int(max_ttl))


def recorded_layout(client: RedisClient, prefix: str) -> Layout | None:
    """The layout recorded for ``prefix``, or None when no process used it yet."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(KeySpace(prefix=prefix).layout())
    try:
        [fields] = pipe.execute()
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "reading the key layout") from exc
    return Layout.parse(fields) if fields else None


def check_layout(client: RedisClient, keys: KeySpace, *, replicas: int = 0) -> None:
    """Check at start that this process may use ``keys`` on this Redis; raise ConfigError if not.

    Steps:
    1. A single-node client must not talk to a server in cluster mode.
    2. The server must run with ``maxmemory-policy noeviction`` (a warning when unreadable).
    3. Record the layout on first use; otherwise it must match ``keys`` (shards, max_ttl_ms),
       and a version 1 record is upgraded in place once no v1 dedup key is left.
    4. Replicated durability: every master has ``replicas`` connected replicas.
    """
    # Step 1.
    if not isinstance(client, RedisCluster) and cluster_mode(client):
        # A single-node client sends one script call per batch over many hash slots: a
        # cluster answers CROSSSLOT to every one of them.
        raise ConfigError("this Redis runs in cluster mode: pass a redis.cluster.RedisCluster "
                          "client (RedisConfig(client=...)), or its URL (RedisConfig(url=...))")
    # Step 2.
    check_eviction_policy(client)
    # Step 3.
    layout = _settle(client, keys)
    if layout.shards != keys.shards:
        raise ConfigError(
            f"key prefix {keys.prefix!r} is laid out in {layout.shards} shards, but this process "
            f"is configured with {keys.shards}; use shards={layout.shards} (or another prefix)")
    if layout.max_ttl_ms != keys.max_ttl_ms:
        raise ConfigError(
            f"key prefix {keys.prefix!r} is laid out with max_ttl_ms={layout.max_ttl_ms}, but "
            f"this process is configured with {keys.max_ttl_ms}; use "
            f"KeySpace(max_ttl_ms={layout.max_ttl_ms}) (or another prefix)")
    # Step 4.
    if replicas:
        check_replicas(client, replicas)


def _settle(client: RedisClient, keys: KeySpace) -> Layout:
    """The prefix's layout after recording ``keys`` on first use or upgrading a v1 record.

    WATCH makes each write conditional on the record read: a concurrent start that wrote it
    first aborts ours (WatchError) and we judge again what it wrote. An upgrade thus happens
    only if the record still says version 1 when it is written.
    """
    name = keys.layout()
    for _ in range(_ATTEMPTS):
        pipe: Any = client.pipeline(transaction=True)
        try:
            pipe.watch(name)
            fields = pipe.hgetall(name)
            layout = Layout.parse(fields) if fields else None
            if layout is not None and layout.version == LAYOUT_VERSION \
                    and layout.shards is not None and layout.max_ttl_ms is not None:
                return layout  # the common start: nothing to write
            if layout is not None and layout.version > LAYOUT_VERSION:
                raise ConfigError(
                    f"key prefix {keys.prefix!r} holds layout version {layout.version}, newer than "
                    f"this eoguard's {LAYOUT_VERSION}: upgrade eoguard (or use another prefix)")
            if layout is not None and layout.version < LAYOUT_VERSION:
                _refuse_legacy_keys(client, keys)
                if layout.shards is not None and layout.shards != keys.shards:
                    return layout  # refused by the caller, nothing upgraded
            pipe.multi()
            pipe.hsetnx(name, "shards", keys.shards)
            pipe.hset(name, "version", LAYOUT_VERSION)
            pipe.hsetnx(name, "max_ttl_ms", keys.max_ttl_ms)
            pipe.hgetall(name)
            written = Layout.parse(pipe.execute()[-1])
        except redis.WatchError:
            continue  # another process wrote the record meanwhile: judge what it wrote
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "recording the key layout") from exc
        finally:
            pipe.reset()
        if layout is not None:
            log.info("key prefix %r: no dedup key of layout version %d left, layout upgraded "
                        "to version %d", keys.prefix, layout.version, LAYOUT_VERSION)
        return written
    raise StoreError(f"recording the key layout of {keys.prefix!r}: the record kept changing "
                     f"({_ATTEMPTS} attempts)")


def _refuse_legacy_keys(client: RedisClient, keys: KeySpace) -> None:
    left = count_keys(client, keys.legacy_dedup_pattern())  # SCAN, every node of a cluster
    if left:
        raise ConfigError(
            f"key prefix {keys.prefix!r} holds {left} dedup keys of layout version 1: let them "
            "expire (eoguard status shows how many remain) or use another prefix")


def check_eviction_policy(client: RedisClient) -> None:
    """Refuse a server that may evict keys; warn when neither CONFIG nor INFO may be read."""
    policies = _eviction_policies(client)
    if policies is None:
        log.warning("cannot read maxmemory-policy (CONFIG GET and INFO memory refused): make "
                    "sure Redis runs with noeviction, or an evicted key is a silent duplicate "
                    "or loss")
        return
    for policy in policies:
        if policy != "noeviction":
            raise ConfigError(
                f"Redis runs with maxmemory-policy {policy}: it may evict claims and outbox "
                "records (silent duplicates or loss); run CONFIG SET maxmemory-policy "
                "noeviction (and set it in redis.conf)")


def _eviction_policies(client: RedisClient) -> list[str] | None:
    """The policy of every node (one on a single node), or None when Redis refuses both ways."""
    for read in (_config_get, _info_memory):
        try:
            policies = read(client)
        except redis.ResponseError:  # refused: an ACL, a renamed or disabled command
            continue
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "reading maxmemory-policy") from exc
        if policies:
            return policies
    return None


def _config_get(client: RedisClient) -> list[str]:
    if isinstance(client, RedisCluster):  # keyless commands cannot go in a cluster pipeline
        reply = client.config_get("maxmemory-policy", target_nodes=RedisCluster.PRIMARIES)
        replies = _per_node(reply, "maxmemory-policy")
    else:
        pipe = client.pipeline(transaction=False)
        pipe.config_get("maxmemory-policy")
        replies = pipe.execute()
    return [reply_text(r["maxmemory-policy"]) for r in replies if "maxmemory-policy" in r]


def _info_memory(client: RedisClient) -> list[str]:
    if isinstance(client, RedisCluster):
        reply = client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        replies = _per_node(reply, "maxmemory_policy")
    else:
        pipe = client.pipeline(transaction=False)
        pipe.info("memory")
        replies = pipe.execute()
    return [reply_text(r["maxmemory_policy"]) for r in replies if "maxmemory_policy" in r]


def _per_node(reply: Any, field: str) -> list[dict[Any, Any]]:
    """A cluster reply: the node's dict when one node answered, else one dict per node."""
    if isinstance(reply, dict) and field not in reply \
            and all(isinstance(v, dict) for v in reply.values()):
        return cast("list[dict[Any, Any]]", list(reply.values()))
    return [reply] if isinstance(reply, dict) else []
