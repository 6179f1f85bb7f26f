"""Reading the dedup keys for the CLI and the Spark job: claim keys with their batch records.

SCAN (never KEYS, every node of a cluster) by the patterns of :class:`KeySpace`, then pipelined
GETs. A key that expires in between is left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from eoguard.store.client import RedisClient
from eoguard.store.dedup_types import BatchRecord, DedupEntry
from eoguard.store.keys import KeySpace
from eoguard.store.scan import scan_pages
from eoguard.store.scripts import Scripts

__all__ = ["count_keys", "read_entries", "read_records", "scan_batches", "scan_entries"]


def scan_entries(client: RedisClient, keys: KeySpace, *, scope: str | None = None,
                 count: int = 1000) -> Iterator[list[DedupEntry]]:
    """Every claim key of ``scope`` (or of all scopes), one list per SCAN call (may be empty).

    For the CLI: SCAN (never KEYS) by :meth:`KeySpace.dedup_pattern`, then
    :func:`read_entries` per batch. A key that expires in between is left out.
    """
    for names in scan_pages(client, keys.dedup_pattern(scope), count=count,
                            doing="scanning claim keys"):
        yield read_entries(client, keys, names)


def scan_batches(client: RedisClient, keys: KeySpace, *, scope: str | None = None,
                 count: int = 1000) -> Iterator[list[BatchRecord]]:
    """Every batch record of ``scope`` (or of all scopes), one list per SCAN call."""
    scripts = Scripts(client)
    for names in scan_pages(client, keys.dedup_batch_pattern(scope), count=count,
                            doing="scanning batch records"):
        texts = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        yield [record for record in read_records(scripts, client, texts).values()
               if record is not None]


def count_keys(client: RedisClient, pattern: str, *, count: int = 1000) -> int:
    """How many keys match ``pattern`` (SCAN, never KEYS): e.g. v1 dedup keys left."""
    return sum(len(names) for names in scan_pages(client, pattern, count=count,
                                                      doing="counting keys"))


def read_entries(client: RedisClient, keys: KeySpace, names: Sequence[str | bytes]
                 ) -> list[DedupEntry]:
    """The claim keys ``names`` with their batch records: two pipelined round trips.

    The message id is the key's last segment, checked by rebuilding the key with
    :meth:`KeySpace.dedup`; absent keys and keys that do not round-trip are left out.
    """
    if not names:
        return []
    scripts = Scripts(client)
    pipe: Any = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
        pipe.execute_command("PEXPIRETIME", name)
    replies = scripts.execute(pipe, doing="reading claim keys")
    found: list[tuple[str, str, int]] = []
    for i, name in enumerate(names):
        value, expire_at = replies[2 * i], replies[2 * i + 1]
        if value is None:
            continue
        key = name.decode() if isinstance(name, bytes) else str(name)
        text = value.decode() if isinstance(value, bytes) else str(value)
        if keys.dedup(KeySpace.scope_of(key), key.rsplit(":", 1)[-1]) == key:
            found.append((key, text, int(expire_at)))
    record_keys = {key: _record_key(keys, key, text) for key, text, _ in found}
    records = read_records(scripts, client, sorted(set(record_keys.values())))
    return [DedupEntry.parse(key, text, expire_at, records.get(record_keys[key]))
            for key, text, expire_at in found]


def _record_key(keys: KeySpace, claim_key: str, value: str) -> str:
    """The batch record a claim key's value names (same scope and shard, its token)."""
    tag = claim_key[claim_key.index("{") + 1:claim_key.index("}")]
    scope, shard = tag.rsplit("/", 1)
    return keys.dedup_batch(scope, int(shard), value.split("|", 2)[1])


def read_records(scripts: Scripts, client: RedisClient, names: Sequence[str]
                 ) -> dict[str, BatchRecord | None]:
    """The batch records ``names`` (None where absent): one pipelined round trip."""
    if not names:
        return {}
    pipe: Any = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
        pipe.execute_command("PEXPIRETIME", name)
    replies = scripts.execute(pipe, doing="reading batch records")
    out: dict[str, BatchRecord | None] = {}
    for i, name in enumerate(names):
        value = replies[2 * i]
        out[name] = None if value is None else BatchRecord.parse(
            name, value.decode() if isinstance(value, bytes) else str(value), int(replies[2 * i + 1]))
    return out
