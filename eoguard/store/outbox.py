"""The outbox: one Redis string per message not yet known to be consumed, TTL = expires_at
(at most Redis's now + ``max_ttl`` when written, whatever the producer's clock says).

A record goes ``pending`` (written by the producer) -> ``published`` (Kafka acknowledged;
kept only with ``keep_until=consumed``) -> deleted (the consumer's end-to-end ack, or at
publication with ``keep_until=published``); its TTL deletes it at ``expires_at`` in every
case. Each shard's index (a sorted set by next-resend time) holds the pending records only,
so a published record is never resent however slow its consumer is. The record's value
layout is in :mod:`eoguard.store.outbox_types`.

Every operation is a Lua script (``eoguard/store/lua/outbox_*.lua``). A producer's writes
and publish marks (``outbox_write.lua``) cover every shard of a batch in one script call (one
AOF fsync per batch), except on Redis Cluster, where a script's keys must share a slot:
there a batch sends one call per shard, pipelined in one round trip. The consumer's acks
do the same (one call, or one per shard on a cluster); resend claims and sweeps send one call
per shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redis.cluster import RedisCluster

from eoguard.modes import KeepUntil
from eoguard.store.client import RedisClient, reply_text
from eoguard.store.keys import KeySpace
from eoguard.store.outbox_types import (
    ClaimBatch,
    ClaimedRecord,
    OutboxEntry,
    OutboxRecord,
    PublishResult,
    PutResult,
    RecordState,
    StoredRecord,
    parse_record,
    record_body,
)
from eoguard.store.scripts import ScriptArg, ScriptCall, Scripts

__all__ = [
    "ClaimBatch",
    "ClaimedRecord",
    "Outbox",
    "OutboxEntry",
    "OutboxRecord",
    "PublishResult",
    "PutResult",
    "RecordState",
    "StoredRecord",
]


class Outbox:
    """Typed wrappers over the outbox scripts for one :class:`KeySpace`."""

    def __init__(self, client: RedisClient, keys: KeySpace, *,
                 scripts: Scripts | None = None) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts or Scripts(client)
        # Redis Cluster: one script call per shard (its keys share the shard's hash slot).
        self.per_shard = isinstance(client, RedisCluster)
        self._record_prefixes: dict[int, str] = {}  # shard -> a record's key without its id

    # Grouping ------------------------------------------------------------------------
    def _record_prefix(self, shard: int, message_id: str) -> str:
        prefix = self._record_prefixes.get(shard)
        if prefix is None:
            key = self.keys.outbox_record(message_id)
            prefix = self._record_prefixes[shard] = key[:len(key) - len(message_id)]
        return prefix

    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        shard_of = self.keys.shard_of
        for message_id in ids:
            shard = shard_of(message_id)
            members = groups.get(shard)
            if members is None:
                groups[shard] = [message_id]
            else:
                members.append(message_id)
        return groups

    def _per_shard_calls(self, script: str, ids: Iterable[str]) -> list[ScriptCall]:
        calls = []
        for shard, members in self._by_shard(ids).items():
            prefix = self._record_prefix(shard, members[0])
            calls.append(ScriptCall(script, [self.keys.outbox_index(shard),
                                             *(prefix + m for m in members)], members))
        return calls

    # Writes: new records and publish marks --------------------------------------------
    def write(self, records: Sequence[OutboxEntry] = (), *, owner: str, keep_until: KeepUntil,
              resend_after_ms: int, published: Iterable[str] = ()
              ) -> tuple[PutResult, PublishResult]:
        """Mark ``published`` (acknowledged by Kafka; records written with the same
        ``keep_until``) and store ``records`` as pending, owned by ``owner``.

        One round trip, and one script call (one AOF fsync) for the lot; on Redis Cluster one
        call per shard. A batch that fails midway may be stored in part: records are written
        with SET NX and marks are idempotent, so writing it again is safe.
        """
        marks = self._by_shard(published)
        puts: dict[int, list[OutboxEntry]] = {}
        shard_of = self.keys.shard_of
        for rec in records:
            shard = shard_of(rec.id)
            members = puts.get(shard)
            if members is None:
                puts[shard] = [rec]
            else:
                members.append(rec)
        chunks: list[tuple[dict[int, list[str]], dict[int, list[OutboxEntry]]]]
        if self.per_shard:
            chunks = [({s: m}, {}) for s, m in marks.items()]
            chunks += [({}, {s: m}) for s, m in puts.items()]
        else:
            chunks = [(marks, puts)] if marks or puts else []
        calls = []
        ordered: list[list[OutboxEntry]] = []
        keep = keep_until.value.encode()
        for mark_groups, put_groups in chunks:
            keys: list[str] = []
            args: list[ScriptArg] = [owner, resend_after_ms, keep_until.value,
                                     len(mark_groups), len(put_groups), self.keys.max_ttl_ms]
            args += [len(m) for m in mark_groups.values()]
            args += [len(m) for m in put_groups.values()]
            prefixes = [self._record_prefix(shard, ids[0]) for shard, ids in mark_groups.items()]
            prefixes += [self._record_prefix(shard, members[0].id)
                         for shard, members in put_groups.items()]
            args += [len(prefix) for prefix in prefixes]
            for (shard, ids), prefix in zip(mark_groups.items(), prefixes, strict=False):
                keys.append(self.keys.outbox_index(shard))
                keys += [prefix + i for i in ids]
            in_call: list[OutboxEntry] = []
            for (shard, members), prefix in zip(put_groups.items(), prefixes[len(mark_groups):],
                                                strict=True):
                keys.append(self.keys.outbox_index(shard))
                for rec in members:
                    keys.append(prefix + rec.id)
                    args += (rec.expires_at_ms, record_body(rec, keep))
                in_call += members
            calls.append(ScriptCall("outbox_write", keys, args))
            ordered.append(in_call)
        replies = self.scripts.run(calls, doing="writing the outbox")
        return (_put_result(records, ordered, replies),
                PublishResult(kept=sum(int(r[1]) for r in replies),
                              deleted=sum(int(r[2]) for r in replies),
                              missing=sum(int(r[3]) for r in replies)))

    def put(self, records: Sequence[OutboxEntry], *, owner: str, keep_until: KeepUntil,
            resend_after_ms: int) -> PutResult:
        """Store ``records`` as pending, owned by ``owner``: :meth:`write` without marks."""
        return self.write(records, owner=owner, keep_until=keep_until,
                          resend_after_ms=resend_after_ms)[0]

    def mark_published(self, ids: Iterable[str], *, keep_until: KeepUntil) -> PublishResult:
        """Kafka acknowledged ``ids``, records written with ``keep_until``: they leave the
        index and are kept as published or deleted; one round trip."""
        return self.write(owner="", keep_until=keep_until, resend_after_ms=0, published=ids)[1]

    def ack_calls(self, ids: Iterable[str]) -> list[ScriptCall]:
        """The script calls of :meth:`ack`, for a caller that pipelines them with its own: one
        call for every shard on a single node (a consumer acks with each done mark, so a call
        per shard was up to 16 script runs a round trip), one per shard on a cluster."""
        groups = self._by_shard(ids)
        chunks = [{s: m} for s, m in groups.items()] if self.per_shard else [groups] if groups else []
        calls = []
        for chunk in chunks:
            keys: list[str] = []
            ordered: list[str] = []
            for shard, members in chunk.items():
                prefix = self._record_prefix(shard, members[0])
                keys.append(self.keys.outbox_index(shard))
                keys += [prefix + m for m in members]
                ordered += members
            calls.append(ScriptCall("outbox_ack", keys,
                                    [len(chunk), *(len(m) for m in chunk.values()), *ordered]))
        return calls

    def ack(self, ids: Iterable[str]) -> int:
        """The consumer's end-to-end ack: delete the records; returns how many existed."""
        replies = self.scripts.run(self.ack_calls(ids), doing="acknowledging outbox records")
        return sum(int(r) for r in replies)

    # Resend ----------------------------------------------------------------------------
    def claim_for_resend(self, *, claimer: str, live_owners: Iterable[str],
                         live_read_at_ms: int, resend_after_ms: int,
                         page_size: int = 500, max_pages: int = 20) -> ClaimBatch:
        """Take ownership of every pending record that is due or whose owner's lease lapsed.

        Step 1. Read a page of candidate ids from every shard's index (one round trip).
        Step 2. Run the claim script per shard on its candidates (one round trip): it checks
                and sets the owner atomically, bumps ``attempt`` and pushes the next-resend
                time, so of two concurrent claimers only one gets each record.
        Step 3. Page on through shards whose page was full (skipped records stay in front).
        """
        live = sorted(set(live_owners))
        offsets = dict.fromkeys(range(self.keys.shards), 0)
        records: list[ClaimedRecord] = []
        swept = expired = scanned = 0
        for _ in range(max_pages):
            if not offsets:
                break
            # Step 1.
            pipe = self.client.pipeline(transaction=False)
            shards = list(offsets)
            for shard in shards:
                pipe.zrange(self.keys.outbox_index(shard), offsets[shard],
                            offsets[shard] + page_size - 1)
            pages = self.scripts.execute(pipe, doing="reading the outbox index")
            # Step 2.
            calls: list[ScriptCall] = []
            called: list[tuple[int, int]] = []
            for shard, page in zip(shards, pages, strict=True):
                ids = [reply_text(m) for m in page]
                if not ids:
                    del offsets[shard]
                    continue
                prefix = self._record_prefix(shard, ids[0])
                keys = [self.keys.outbox_index(shard), *(prefix + i for i in ids)]
                calls.append(ScriptCall("outbox_claim_for_resend", keys,
                                        [claimer, resend_after_ms, live_read_at_ms,
                                         len(live), *live, *ids]))
                called.append((shard, len(ids)))
            replies = self.scripts.run(calls, doing="claiming outbox records for resend")
            # Step 3.
            for (shard, n), reply in zip(called, replies, strict=True):
                claimed = [self._claimed(item) for item in reply[3:]]
                records += claimed
                swept += int(reply[1])
                expired += int(reply[2])
                scanned += n
                if n < page_size:
                    del offsets[shard]
                else:
                    offsets[shard] += n - len(claimed) - int(reply[1]) - int(reply[2])
        return ClaimBatch(records=records, swept=swept, expired=expired, scanned=scanned)

    def claim_ids_for_resend(self, ids: Sequence[str], *, claimer: str,
                             live_owners: Iterable[str], live_read_at_ms: int,
                             resend_after_ms: int) -> ClaimBatch:
        """:meth:`claim_for_resend` for the named records only (``eoguard outbox resend ID``).

        Same script, same compare-and-set: a record is taken only if pending, unexpired, and
        due or owned by an owner not in ``live_owners``; absent ones are skipped.
        """
        live = sorted(set(live_owners))
        calls = [ScriptCall(c.script, c.keys,
                            [claimer, resend_after_ms, live_read_at_ms, len(live), *live, *c.args])
                 for c in self._per_shard_calls("outbox_claim_for_resend", dict.fromkeys(ids))]
        replies = self.scripts.run(calls, doing="claiming outbox records for resend")
        return ClaimBatch(records=[self._claimed(item) for r in replies for item in r[3:]],
                          swept=sum(int(r[1]) for r in replies),
                          expired=sum(int(r[2]) for r in replies), scanned=len(ids))

    @staticmethod
    def _claimed(item: Sequence[Any]) -> ClaimedRecord:
        f = parse_record(bytes(item[2]))
        return ClaimedRecord(id=reply_text(item[0]), topic=f.topic, key=f.key, value=f.value,
                             headers=f.headers, attempt=f.attempt, keep_until=f.keep_until,
                             expires_at_ms=f.expires_at_ms, previous_owner=reply_text(item[1]))

    # Inspection ------------------------------------------------------------------------
    def get(self, message_id: str) -> StoredRecord | None:
        """The record of ``message_id`` as stored, or None when absent."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.outbox_record(message_id))
        raw = self.scripts.execute(pipe, doing="reading an outbox record")[0]
        if raw is None:
            return None
        f = parse_record(raw)
        return StoredRecord(
            id=message_id, topic=f.topic, key=f.key, value=f.value, headers=f.headers,
            state=f.state, owner=f.owner, attempt=f.attempt, keep_until=f.keep_until,
            created_at_ms=f.created_at_ms, expires_at_ms=f.expires_at_ms,
            owned_at_ms=f.owned_at_ms, next_resend_at_ms=f.next_resend_at_ms)

    def pending_ids(self) -> dict[int, list[str]]:
        """Every shard's index members (pending records), for tests and the CLI."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.keys.shards):
            pipe.zrange(self.keys.outbox_index(shard), 0, -1)
        pages = self.scripts.execute(pipe, doing="reading the outbox index")
        return {shard: [reply_text(m) for m in page] for shard, page in enumerate(pages) if page}

    def expire_times(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        """PEXPIRETIME of each record key (-2 absent, -1 no TTL), for tests and the CLI."""
        pipe = self.client.pipeline(transaction=False)
        for message_id in message_ids:
            pipe.execute_command("PEXPIRETIME", self.keys.outbox_record(message_id))
        replies = self.scripts.execute(pipe, doing="reading outbox expiry times")
        return {m: int(r) for m, r in zip(message_ids, replies, strict=True)}


def _put_result(records: Sequence[OutboxEntry], ordered: list[list[OutboxEntry]],
                replies: list[Any]) -> PutResult:
    """What ``outbox_write`` stored, found present and found expired, from its replies (each
    lists the entries it did not store by their position in its call)."""
    existing: list[OutboxEntry] = []
    expired: list[str] = []
    refused: set[int] = set()  # by identity: two entries of one id may differ in fate
    for in_call, reply in zip(ordered, replies, strict=True):
        for i in range(5, len(reply), 2):
            entry = in_call[int(reply[i]) - 1]
            refused.add(id(entry))
            if int(reply[i + 1]) == 0:
                existing.append(entry)
            else:
                expired.append(entry.id)
    return PutResult(stored=[r.id for r in records if id(r) not in refused],
                     existing=[e.id for e in existing], expired=expired,
                     existing_entries=existing)
