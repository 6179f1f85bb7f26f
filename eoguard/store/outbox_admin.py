"""The operator's view of the outbox (``eoguard status`` / ``outbox list|purge``, metrics).

Read-only listings go by SCAN (never KEYS) with one pipelined read per batch, and read only
the head of each record (``GETRANGE``: its metadata, not the encoded value). The purge sweeps
index entries of records that are gone, atomically per shard (``outbox_sweep.lua``). Writes to
records stay in :class:`eoguard.store.outbox.Outbox`; resends go through
:mod:`eoguard.producer.recovery`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from eoguard.store.bindings.outbox import OutboxSweep
from eoguard.store.client import RedisClient, reply_text
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import RecordState
from eoguard.store.outbox_types import parse_record
from eoguard.store.scan import scan_pages
from eoguard.store.scripts import Scripts

__all__ = ["IndexStats", "RecordSummary", "index_stats", "read_records", "scan_records", "sweep_index"]

_HEAD_BYTES = 1024  # of a record: its metadata and topic (longer ones are read whole)


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordSummary:
    """An outbox record's metadata, without its value; ``redis_key`` for MEMORY USAGE."""

    id: str
    redis_key: str
    topic: str
    state: RecordState
    owner: str
    attempt: int
    created_at_ms: int
    expires_at_ms: int
    next_resend_at_ms: int


@dataclass(frozen=True, kw_only=True, slots=True)
class IndexStats:
    """Cheap figures from the resend indexes (no SCAN): what metrics scrape."""

    now_ms: int  # Redis time
    pending: int  # index entries (pending records, and entries of records gone since)
    past_resend: int  # entries whose next-resend time has passed
    oldest_pending_age_ms: int  # of the records at the head of each shard's index; 0 if none


def scan_records(client: RedisClient, keys: KeySpace, *, count: int = 1000
                 ) -> Iterator[list[RecordSummary]]:
    """Every outbox record's summary, one list per SCAN call (possibly empty).

    A record that expires or is acknowledged between the SCAN and the read is left out.
    """
    for names in scan_pages(client, keys.outbox_record_pattern(), count=count,
                            doing="scanning the outbox"):
        yield read_records(client, names)


def read_records(client: RedisClient, names: Sequence[str | bytes]) -> list[RecordSummary]:
    """The outbox records ``names`` (found by SCAN): one pipelined ``GETRANGE`` of each one's
    head, and a second round trip for any record whose metadata is longer than that."""
    if not names:
        return []
    scripts = Scripts(client)
    pipe: Any = client.pipeline(transaction=False)
    for name in names:
        pipe.getrange(name, 0, _HEAD_BYTES - 1)
    heads = scripts.execute(pipe, doing="reading outbox records")
    out = []
    for name, head in zip(names, heads, strict=True):
        if not head:
            continue  # expired or acknowledged since the SCAN
        try:
            f = parse_record(head, partial=True)
        except ValueError:
            pipe = client.pipeline(transaction=False)
            pipe.get(name)
            whole = scripts.execute(pipe, doing="reading an outbox record")[0]
            if whole is None:
                continue
            f = parse_record(whole)
        key = reply_text(name)  # KeySpace.outbox_record: "<prefix>:ob:{<shard>}:r:<id>"
        out.append(RecordSummary(
            id=key.split(":r:", 1)[1], redis_key=key, topic=f.topic, state=f.state,
            owner=f.owner, attempt=f.attempt, created_at_ms=f.created_at_ms,
            expires_at_ms=f.expires_at_ms, next_resend_at_ms=f.next_resend_at_ms))
    return out


def sweep_index(client: RedisClient, keys: KeySpace, *, dry_run: bool, page_size: int = 1000
                ) -> list[str]:
    """Remove (or with ``dry_run`` only list) index entries whose record is gone."""
    scripts = Scripts(client)
    found: list[str] = []
    for shard in range(keys.shards):
        index = keys.outbox_index(shard)
        cursor: Any = 0
        while True:
            pipe: Any = client.pipeline(transaction=False)
            pipe.zscan(index, cursor, count=page_size)
            cursor, members = scripts.execute(pipe, doing="reading the outbox index")[0]
            ids = [reply_text(member) for member, _ in members]
            if ids:
                found += OutboxSweep.parse(scripts.run_one(OutboxSweep.build(
                    index=index, records=[keys.outbox_record(i) for i in ids], ids=ids,
                    dry_run=dry_run)))
            if int(cursor) == 0:
                break
    return found


def index_stats(client: RedisClient, keys: KeySpace) -> IndexStats:
    """Pending count, past-resend count and oldest pending age: two round trips, no SCAN."""
    scripts = Scripts(client)
    pipe: Any = client.pipeline(transaction=False)
    pipe.time()
    for shard in range(keys.shards):
        pipe.zcard(keys.outbox_index(shard))
        pipe.zrange(keys.outbox_index(shard), 0, 0)
    replies = scripts.execute(pipe, doing="reading the outbox index")
    seconds, micros = replies[0]
    now = int(seconds) * 1000 + int(micros) // 1000
    pending = sum(int(n) for n in replies[1::2])
    heads = [reply_text(page[0]) for page in replies[2::2] if page]
    pipe = client.pipeline(transaction=False)
    for shard in range(keys.shards):
        pipe.zcount(keys.outbox_index(shard), "-inf", now)
    for message_id in heads:
        pipe.getrange(keys.outbox_record(message_id), 0, _HEAD_BYTES - 1)
    replies = scripts.execute(pipe, doing="reading the outbox index")
    past = sum(int(n) for n in replies[:keys.shards])
    created = [parse_record(head, partial=True).created_at_ms
               for head in replies[keys.shards:] if head]
    return IndexStats(now_ms=now, pending=pending, past_resend=past,
                      oldest_pending_age_ms=max(0, now - min(created)) if created else 0)
