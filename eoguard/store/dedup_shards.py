"""Where a scope's dedup keys live: their names per shard, and how a batch's claims group into
script calls (all shards in one call on a single node, one call per shard on Redis Cluster)."""

from __future__ import annotations

from collections.abc import Sequence

from eoguard.store.dedup_types import Claim
from eoguard.store.keys import KeySpace

__all__ = ["Groups", "ScopeShards"]

Groups = dict[int, tuple[list[int], list[str]]]
"""Claims by shard: shard -> (their indexes in the batch, their claim keys)."""


class ScopeShards:
    """The key prefixes of one scope per shard, and the grouping of claims into calls."""

    def __init__(self, keys: KeySpace, scope: str, *, one_call: bool) -> None:
        self.keys = keys
        self.one_call = one_call
        self.key_prefixes = keys.dedup_prefixes(scope)
        self.record_prefixes = tuple(keys.dedup_batch_prefix(scope, shard)
                                     for shard in range(keys.shards))
        self.reowned_prefixes = tuple(keys.dedup_reowned_prefix(scope, shard)
                                      for shard in range(keys.shards))
        self.passed_prefixes = tuple(keys.dedup_passed_prefix(scope, shard)
                                     for shard in range(keys.shards))

    def group(self, claims: Sequence[Claim]) -> Groups:
        """The claims by shard, in order of first appearance."""
        groups: Groups = {}
        keys, prefixes = self.keys, self.key_prefixes
        for i, claim in enumerate(claims):
            if claim[4]:
                shard, key = claim[3], claim[4]
            else:
                shard = keys.shard_of(claim[0])
                key = prefixes[shard] + claim[0]
            group = groups.get(shard)
            if group is None:
                groups[shard] = ([i], [key])
            else:
                group[0].append(i)
                group[1].append(key)
        return groups

    def calls(self, groups: Groups) -> list[list[int]]:
        """The shards of each script call: all in one on a single node, one each on a cluster."""
        if not groups:
            return []
        return [list(groups)] if self.one_call else [[shard] for shard in groups]

    @staticmethod
    def order(groups: Groups) -> list[int]:
        """The claims' indexes in the order the calls list their keys."""
        return [i for members, _ in groups.values() for i in members]
