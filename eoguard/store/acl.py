"""The Redis commands a producer and a consumer send, for an ACL user of least privilege.

Redis checks an ACL user's rights on every command, those a Lua script runs included, so the
list names what eoguard's scripts call as well as what it sends. A test runs producers (both
persistence modes, a recovery) and a consumer (claims, done marks with effects, outbox
acknowledgements) as a user with these rights and nothing more
(tests/integration/test_least_privilege.py); a unit test checks that every command a Lua
script runs is listed (tests/unit/test_acl.py). docs/operations.md shows the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["RUNTIME_COMMANDS", "TRIED_FIRST", "acl_rules"]

RUNTIME_COMMANDS: tuple[str, ...] = (
    # scripts and plain commands beside them (a consumer's fresh claims: store/dedup_fresh.py)
    "EVALSHA", "EVAL", "SCRIPT|LOAD", "TIME",
    "GET", "MGET", "SET", "SETRANGE", "DEL", "EXISTS", "TYPE", "PEXPIREAT", "PEXPIRETIME",
    "WATCH", "UNWATCH", "MULTI", "EXEC",
    # outbox indexes and live leases (sorted sets); the prefix's layout and the positions a
    # Spark job's attempt gave up (hashes: a consumer of the job's scope reads them)
    "ZADD", "ZREM", "ZCARD", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZREMRANGEBYSCORE",
    "HGETALL", "HSET", "HSETNX", "HEXISTS",
    # server facts read at start: cluster mode, maxmemory-policy (INFO memory), replicas
    "INFO",
    # Redis Cluster: the client's slot map and command table (redis-py reads both at start),
    # and a key's slot in migration
    "CLUSTER|SLOTS", "COMMAND", "ASKING",
)
"""Every command a GuardedProducer or GuardedConsumer sends, or runs in a script, on its own
keys, with the default durability on database 0. Beside them: a handler's effects add the
commands they use (``INCRBY`` for ``ctx.tx.incr``; ``HINCRBY`` and ``HGET`` for
``ctx.tx.hincrby``), ``durability="replicated"`` adds ``WAIT`` (and ``CLUSTER|NODES``,
``CLUSTER|MYID`` on a cluster, to tell a failover from a missing replica), a database other
than 0 ``SELECT``, and a prefix first used with key layout version 1 ``SCAN`` (once)."""


TRIED_FIRST: tuple[str, ...] = ("CONFIG|GET", "CLIENT|SETINFO")
"""Commands tried and not needed: refused, another answers or nothing is lost (``CONFIG GET
maxmemory-policy``: then ``INFO memory``; redis-py names itself with ``CLIENT SETINFO`` on
Redis 7.2 and later, and goes on when refused). Redis's ACL LOG lists each refusal."""

_GLOB = re.compile(r"([*?\[\]\\])")  # what a Redis key pattern reads as a pattern


def acl_rules(key_prefix: str, *, effects: Iterable[str] = ()) -> list[str]:
    """The ``ACL SETUSER`` rules of a user that runs eoguard on ``key_prefix`` and nothing
    else: its keys only (glob characters in the prefix escaped, so they match only
    themselves), :data:`RUNTIME_COMMANDS` and the ``effects`` commands only."""
    commands = [*RUNTIME_COMMANDS, *effects]
    prefix = _GLOB.sub(r"\\\1", key_prefix)
    return ["resetkeys", f"~{prefix}:*", "resetchannels", "-@all",
            *(f"+{command.lower()}" for command in commands)]
