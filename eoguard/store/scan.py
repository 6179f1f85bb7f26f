"""SCAN over every key of a Redis, one page per call: on a cluster, every master in turn.

A single SCAN cursor belongs to one server; a cluster's keys are spread over its masters, so
``eoguard status`` and the outbox listing walk each master's keyspace with its own cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
from redis.cluster import RedisCluster

from eoguard.store.client import RedisClient, wrap_redis_error


def scan_pages(client: RedisClient, pattern: str, *, count: int = 1000,
               doing: str = "scanning keys") -> Iterator[list[Any]]:
    """The names matching ``pattern``, one list per SCAN call (possibly empty)."""
    cluster = client if isinstance(client, RedisCluster) else None
    nodes: list[Any] = cluster.get_primaries() if cluster is not None else [None]
    for node in nodes:
        cursor: Any = 0
        while True:
            try:
                if cluster is None:
                    cursor, names = client.scan(cursor, match=pattern, count=count)  # type: ignore[attr-defined]
                else:
                    # Per node: ({node name: cursor}, names); the stubs say (int, names).
                    cursors: Any
                    cursors, names = cluster.scan(cursor, match=pattern, count=count,
                                                  target_nodes=node)
                    cursor = cursors[node.name]
            except redis.RedisError as exc:
                raise wrap_redis_error(exc, doing) from exc
            yield list(names)
            if int(cursor) == 0:
                break
