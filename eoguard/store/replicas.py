"""Replicated durability: ``WAIT`` after a round trip of writes, and the start check behind it.

With ``RedisConfig(durability="replicated")`` every script round trip ends with
``WAIT <replicas> <timeout>`` on the connection that carried its writes (on a cluster, one per
master the round trip touched, in the same per-node batch of the pipeline): its reply is how
many replicas hold those writes. A call sent on by ASK runs on the importing master with a WAIT
of its own after it on that connection; a call answered MOVED goes again with its new master's
WAIT (:mod:`.redirects`). Fewer than asked is :class:`ReplicationTimeoutError`, a
retry, never a guarantee given on faith: the producer fires ``on_guaranteed`` and the consumer
commits offsets only after a round trip that passed. WAIT counts acknowledgements of the
connection's own writes, so it is never sent on a connection of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster

from eoguard.errors import ConfigError, FailoverUnderWayError, ReplicationTimeoutError
from eoguard.store.client import RedisClient, reply_text, wrap_redis_error


class ReplicaWait(NamedTuple):
    """How many replicas must hold a round trip's writes, and how long to wait for them."""

    replicas: int
    timeout_ms: int


def add_waits(client: RedisClient, pipe: Any, first_keys: Sequence[str], wait: ReplicaWait
              ) -> list[str]:
    """Queue a WAIT after the writes on each node that takes one of ``first_keys``; the nodes'
    names (one empty name on a single node), for :func:`check_acks`."""
    if not isinstance(client, RedisCluster):
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
        return [""]
    nodes = {node.name: node for node in (client.get_node_from_key(k) for k in first_keys)
             if node is not None}
    for node in nodes.values():
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms, target_nodes=node)
    return list(nodes)


def check_acks(client: RedisClient, acks: Sequence[Any], wait: ReplicaWait, doing: str, *,
               first_keys: Sequence[str] = (), planned: Sequence[str] = ()) -> None:
    """Raise ReplicationTimeoutError unless every WAIT reply counts ``wait.replicas``.

    On a cluster, eoguard answers ASK and MOVED itself (:mod:`.redirects`); a call redis-py
    still routes (one its slot map named no node for, or a pipeline it sends anew after a node
    refused the connection) may run elsewhere than the WAITs went: when the slot map changed
    during the round trip (``planned`` against the map now), the round trip is not
    acknowledged either (its scripts are safe to run again).
    """
    for ack in acks:
        check_ack(ack, wait, doing)
    if isinstance(client, RedisCluster):
        now = {node.name for node in (client.get_node_from_key(k) for k in first_keys)
               if node is not None}
        if now != set(planned):
            raise ReplicationTimeoutError(
                f"a hash slot moved during {doing}: its writes were not waited on, retry")


def check_ack(ack: Any, wait: ReplicaWait, doing: str) -> None:
    """Raise ReplicationTimeoutError unless a WAIT's reply counts ``wait.replicas``."""
    if isinstance(ack, Exception):
        raise wrap_redis_error(ack, f"{doing} (WAIT)") from ack
    if int(ack) < wait.replicas:
        raise ReplicationTimeoutError(
            f"{int(ack)} of {wait.replicas} replicas acknowledged the writes of {doing} "
            f"within {wait.timeout_ms} ms: not guaranteed, retry")


def check_replicas(client: RedisClient, replicas: int) -> None:
    """At start: every master must have ``replicas`` connected replicas.

    A shortage is FailoverUnderWayError (retry) where a Redis Cluster explains it for every
    short master (a node of its shard failing for less than 10 minutes: a promoted replica
    is alone until its old master returns; or its replicas known and resyncing); otherwise it
    is ConfigError: the deployment has no replica to wait for, and retrying cannot help.
    """
    try:
        if isinstance(client, RedisCluster):
            reply: Any = client.info("replication", target_nodes=RedisCluster.PRIMARIES)
            infos = dict(reply) if all(isinstance(v, dict) for v in reply.values()) \
                else {"redis": reply}
        else:
            infos = {"redis": client.info("replication")}  # type: ignore[attr-defined]
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "reading INFO replication") from exc
    short = {node: int(info.get("connected_slaves", 0)) for node, info in infos.items()
             if int(info.get("connected_slaves", 0)) < replicas}
    if not short:
        return
    node, have = next(iter(short.items()))
    why = _transient(client, short, replicas)
    if why:
        raise FailoverUnderWayError(
            f"durability='replicated' needs {replicas} replica(s) of every master, but {node} "
            f"has {have} connected while {why}: retry")
    raise ConfigError(
        f"durability='replicated' needs {replicas} replica(s) of every master, but "
        f"{node} has {have}: add a replica, or use durability='local'")


_FAILOVER_WINDOW_MS = 600_000
"""A node down longer than this is no failover under way: it was lost (CLUSTER FORGET it)."""


def _transient(client: RedisClient, short: dict[str, int], replicas: int) -> str | None:
    """Why a Redis Cluster's shortage of replicas will pass, or None. Every short master must
    be explained, by its own shard: a node of it failing recently (its replica down, or its
    old master down after promoting it, in the view of a node that saw the promotion or not
    yet), or its replicas known but not linked yet (restarted, resyncing). A single Redis
    keeps no record of a replica it lost: None."""
    if not isinstance(client, RedisCluster):
        return None
    try:
        nodes: Any = client.cluster_nodes()
        primaries = client.get_primaries()
        ids = []
        for name in short:  # "redis": INFO's reply of a cluster with one primary
            node = client.get_node(node_name=name) if name != "redis" or len(primaries) != 1 \
                else primaries[0]
            if node is None:
                return None
            ids.append(reply_text(client.execute_command(
                "CLUSTER MYID", target_nodes=node)))
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "reading CLUSTER NODES") from exc
    now_ms = int(time.time() * 1000)
    flags = {a: set(str(n["flags"]).split(",")) for a, n in nodes.items()}
    reasons = []
    for me in ids:
        mine = [a for a, n in nodes.items() if n["master_id"] == me]
        # A view that has not seen a promotion yet still has ``me`` replicating its old master.
        was = {n["master_id"] for n in nodes.values() if n["node_id"] == me}
        failing = sorted(
            a for a, n in nodes.items() if {"fail", "fail?"} & flags[a]
            and (a in mine or n["node_id"] in was or ("master" in flags[a] and not n["slots"]))
            and now_ms - int(n["last_pong_rcvd"] or 0) < _FAILOVER_WINDOW_MS)
        # A master back after a failover replaced it rejoins without slots, and becomes a
        # replica once the cluster tells it (seconds): its old shard is short meanwhile.
        rejoining = sorted(a for a, n in nodes.items() if "master" in flags[a]
                           and not n["slots"] and n["node_id"] != me
                           and not {"fail", "fail?", "handshake", "noaddr"} & flags[a])
        # A master a failover replaced is a replica now, yet the client's slot map (read from
        # a node that had not seen the failover) still names it a master: INFO counts none.
        demoted = [a for a, n in nodes.items() if n["node_id"] == me and "slave" in flags[a]]
        if failing:
            reasons.append(f"{', '.join(failing)} is failing: a failover is under way")
        elif demoted:
            reasons.append(f"{demoted[0]} is a replica now: a failover moved its slots and the "
                           "slot map is behind")
        elif rejoining and not mine:
            reasons.append(f"{', '.join(rejoining)} is a master without slots (one a failover "
                           "replaced, rejoining as a replica)")
        elif len(mine) >= replicas:
            reasons.append(f"its replica {', '.join(sorted(mine))} is not linked yet "
                           "(resyncing)")
        else:
            return None  # this master has no replica to wait for
    return "; ".join(reasons)
