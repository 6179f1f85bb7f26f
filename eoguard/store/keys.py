"""The only place eoguard spells Redis key names.

Every key lives under one prefix and carries a hash tag, so each multi-key script touches one
hash slot and the same code runs on Redis Cluster:

    {prefix}:ob:{<shard>}:idx              outbox index of shard <shard> (sorted set)
    {prefix}:ob:{<shard>}:r:<id>           outbox record of message <id> (string: outbox_types.py)
    {prefix}:dd:{<scope>/<shard>}:<id>     dedup key of message <id> in consumer scope <scope>
    {prefix}:fx:{<scope>/<shard>}:<name>   a transactional handler's effect key, in the hash
                                           slot of the dedup keys of <shard> (Cluster-safe)
    {prefix}:live:{producers}              live producer leases (sorted set: instance -> deadline)
    {prefix}:live:{consumers}              live consumer leases (sorted set: instance -> deadline)
    {prefix}:meta:{layout}                 the shard count the prefix was first used with (hash)

A message's shard is a stable hash of its id, so its outbox record and its index entry share
a slot, and one scope's dedup keys spread over ``shards`` slots.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from eoguard.errors import ConfigError

DEFAULT_PREFIX = "eog"
DEFAULT_SHARDS = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class KeySpace:
    """Key names for one prefix and shard count; the store modules take one of these."""

    prefix: str = DEFAULT_PREFIX
    shards: int = DEFAULT_SHARDS

    def __post_init__(self) -> None:
        if not self.prefix or any(c in self.prefix for c in "{}: \t\n"):
            raise ConfigError(f"key prefix {self.prefix!r}: non-empty, no braces, colons or spaces")
        if not 1 <= self.shards <= 16384:
            raise ConfigError(f"shards must be in 1..16384, got {self.shards}")

    def shard_of(self, message_id: str) -> int:
        """The shard a message id belongs to (stable across processes and versions)."""
        return zlib.crc32(message_id.encode()) % self.shards

    def pattern(self) -> str:
        """SCAN pattern for every key under this prefix (one pass for ``eoguard status``)."""
        return f"{self.prefix}:*"

    # Outbox ---------------------------------------------------------------
    def outbox_index(self, shard: int) -> str:
        return f"{self.prefix}:ob:{{{shard}}}:idx"

    def outbox_record(self, message_id: str) -> str:
        return f"{self.prefix}:ob:{{{self.shard_of(message_id)}}}:r:{message_id}"

    def outbox_record_pattern(self) -> str:
        """SCAN pattern for every outbox record."""
        return f"{self.prefix}:ob:*:r:*"

    # Dedup ----------------------------------------------------------------
    def dedup(self, scope: str, message_id: str) -> str:
        return f"{self.prefix}:dd:{{{scope}/{self.shard_of(message_id)}}}:{message_id}"

    def dedup_prefixes(self, scope: str) -> tuple[str, ...]:
        """Per shard, a dedup key of ``scope`` without its message id: ``dedup(scope, id)`` is
        ``prefixes[shard_of(id)] + id`` (how the consumer builds a batch's keys: hot path)."""
        return tuple(f"{self.prefix}:dd:{{{scope}/{shard}}}:" for shard in range(self.shards))

    def dedup_pattern(self, scope: str | None = None) -> str:
        """SCAN pattern for the dedup keys of one scope, or of every scope."""
        return f"{self.prefix}:dd:{{{scope}/*" if scope else f"{self.prefix}:dd:*"

    def effect(self, scope: str, message_id: str, name: str) -> str:
        """Key ``name`` of a handler's Redis-side effects, in the slot of ``message_id``'s dedup key.

        The done script applies effects atomically with the done mark; on Redis Cluster that
        only works for keys sharing the dedup key's hash tag, which this builds.
        """
        return f"{self.prefix}:fx:{{{scope}/{self.shard_of(message_id)}}}:{name}"

    def effect_pattern(self, scope: str, name: str = "*") -> str:
        """SCAN pattern for the effect keys called ``name`` of one scope, over every shard."""
        return f"{self.prefix}:fx:{{{scope}/*}}:{name}"

    def layout(self) -> str:
        """The hash recording this prefix's shard count (see :mod:`eoguard.store.layout`)."""
        return f"{self.prefix}:meta:{{layout}}"

    # Liveness -------------------------------------------------------------
    def live_producers(self) -> str:
        return f"{self.prefix}:live:{{producers}}"

    def live_consumers(self) -> str:
        return f"{self.prefix}:live:{{consumers}}"
