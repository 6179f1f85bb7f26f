"""The only place eoguard spells Redis key names.

Every key lives under one prefix and carries a hash tag, so each multi-key script touches one
hash slot and the same code runs on Redis Cluster:

    {prefix}:ob:{<shard>}:idx              outbox index of shard <shard> (sorted set)
    {prefix}:ob:{<shard>}:r:<id>           outbox record of message <id> (string: outbox_types.py)
    {prefix}:dc:{<scope>/<shard>}:<id>     claim key of message <id> in consumer scope <scope>
    {prefix}:db:{<scope>/<shard>}:<token>  batch record of the claim pass <token> on that shard
    {prefix}:dr:{<scope>/<shard>}:<token>  claims of <token> re-owned by another pass of the same
                                           position (hash: claim key -> position)
    {prefix}:dp:{<scope>/<shard>}:<token>  positions an attempt of <token> gave up as BUSY for
                                           good (hash: position -> 1; a Spark micro-batch's)
    {prefix}:fx:{<scope>/<shard>}:<name>   a transactional handler's effect key, in the hash
                                           slot of the dedup keys of <shard> (Cluster-safe)
    {prefix}:live:{producers}              live producer leases (sorted set: instance -> deadline)
    {prefix}:live:{consumers}              live consumer leases (sorted set: instance -> deadline)
    {prefix}:meta:{layout}                 the layout the prefix was first used with (hash)

A message's shard is a stable hash of its id, so its outbox record and its index entry share
a slot, and one scope's dedup keys spread over ``shards`` slots; a batch record shares the
slot of the claims it covers. ``{prefix}:dd:`` held the claims of layout version 1 (one key
per claim and done mark); :meth:`KeySpace.legacy_dedup_pattern` finds what is left of them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from eoguard.errors import ConfigError

DEFAULT_PREFIX = "eog"
DEFAULT_SHARDS = 16
DEFAULT_MAX_TTL_MS = 30 * 24 * 3_600_000
LAYOUT_VERSION = 2
"""The dedup model the keys follow: 2 is batch leases and batch done marks."""


def check_scope(scope: str) -> str:
    """``scope``, if it can name a consumer scope's keys; else :class:`ConfigError`.

    A scope sits inside the hash tag of its keys (``{<scope>/<shard>}``), where a brace would
    move the tag; ``|`` stays out as it has since the first layout, whose values it separated.
    The one rule for every taker of a scope: configurations, the dedup store, the Spark job.
    """
    if not isinstance(scope, str) or not scope or any(c in scope for c in "|{}"):
        raise ConfigError(f"scope {scope!r} must be non-empty, without '|', '{{', '}}'")
    return scope


@dataclass(frozen=True, kw_only=True, slots=True)
class KeySpace:
    """Key names for one prefix and shard count; the store modules take one of these."""

    prefix: str = DEFAULT_PREFIX
    shards: int = DEFAULT_SHARDS
    max_ttl_ms: int = DEFAULT_MAX_TTL_MS  # no key lives longer than this plus grace

    def __post_init__(self) -> None:
        if not self.prefix or any(c in self.prefix for c in "{}: \t\n"):
            raise ConfigError(f"key prefix {self.prefix!r}: non-empty, no braces, colons or spaces")
        if not 1 <= self.shards <= 16384:
            raise ConfigError(f"shards must be in 1..16384, got {self.shards}")
        if isinstance(self.max_ttl_ms, bool) or not isinstance(self.max_ttl_ms, int) \
                or self.max_ttl_ms <= 0:
            raise ConfigError(f"max_ttl_ms must be a positive integer, got {self.max_ttl_ms!r}")

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
        """The claim key of ``message_id`` in ``scope``."""
        return f"{self.prefix}:dc:{{{scope}/{self.shard_of(message_id)}}}:{message_id}"

    def dedup_prefixes(self, scope: str) -> tuple[str, ...]:
        """Per shard, a claim key of ``scope`` without its message id: ``dedup(scope, id)`` is
        ``prefixes[shard_of(id)] + id`` (how the consumer builds a batch's keys: hot path)."""
        return tuple(f"{self.prefix}:dc:{{{scope}/{shard}}}:" for shard in range(self.shards))

    def dedup_batch(self, scope: str, shard: int, token: str) -> str:
        """The batch record of claim pass ``token`` on ``shard``: its lease and done mark."""
        return f"{self.dedup_batch_prefix(scope, shard)}{token}"

    def dedup_batch_prefix(self, scope: str, shard: int) -> str:
        """A batch record key of ``scope`` and ``shard`` without its token (the claim script
        reads the record of the token a claim key names: same hash tag, same slot)."""
        return f"{self.prefix}:db:{{{scope}/{shard}}}:"

    def dedup_reowned(self, scope: str, shard: int, token: str) -> str:
        """The claims of pass ``token`` on ``shard`` that a later pass of the same position
        re-owned (its done marks take them back if they land first)."""
        return f"{self.dedup_reowned_prefix(scope, shard)}{token}"

    def dedup_reowned_prefix(self, scope: str, shard: int) -> str:
        return f"{self.prefix}:dr:{{{scope}/{shard}}}:"

    def dedup_passed(self, scope: str, shard: int, token: str) -> str:
        """The positions an attempt of pass ``token`` gave up as BUSY on ``shard``: every later
        attempt of the token leaves them too (a Spark task's attempts agree on its rows)."""
        return f"{self.dedup_passed_prefix(scope, shard)}{token}"

    def dedup_passed_prefix(self, scope: str, shard: int) -> str:
        return f"{self.prefix}:dp:{{{scope}/{shard}}}:"

    def dedup_pattern(self, scope: str | None = None) -> str:
        """SCAN pattern for the claim keys of one scope, or of every scope."""
        return f"{self.prefix}:dc:{{{scope}/*" if scope else f"{self.prefix}:dc:*"

    def dedup_batch_pattern(self, scope: str | None = None) -> str:
        """SCAN pattern for the batch records of one scope, or of every scope."""
        return f"{self.prefix}:db:{{{scope}/*" if scope else f"{self.prefix}:db:*"

    def dedup_reowned_pattern(self, scope: str | None = None) -> str:
        """SCAN pattern for the re-owned hashes of one scope, or of every scope."""
        return f"{self.prefix}:dr:{{{scope}/*" if scope else f"{self.prefix}:dr:*"

    def dedup_passed_pattern(self, scope: str | None = None) -> str:
        """SCAN pattern for the passed hashes of one scope, or of every scope."""
        return f"{self.prefix}:dp:{{{scope}/*" if scope else f"{self.prefix}:dp:*"

    def legacy_dedup_pattern(self) -> str:
        """SCAN pattern for the dedup keys of layout version 1, left under this prefix."""
        return f"{self.prefix}:dd:*"

    @staticmethod
    def scope_of(key: str) -> str:
        """The scope in a claim key's or batch record's hash tag ``{<scope>/<shard>}``."""
        return key[key.index("{") + 1:key.index("}")].rsplit("/", 1)[0]

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
