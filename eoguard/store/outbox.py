"""The outbox: one Redis string per message not yet known to be consumed, TTL = expires_at
(at most Redis's now + ``max_ttl`` when written, whatever the producer's clock says).

A record goes ``pending`` (written by the producer) -> ``published`` (Kafka acknowledged;
kept only with ``keep_until=consumed``) -> deleted (the consumer's end-to-end ack, or at
publication with ``keep_until=published``); its TTL deletes it at ``expires_at`` in every
case. Each shard's index (a sorted set by next-resend time) holds the pending records only,
so a published record is never resent however slow its consumer is. The record's value
layout is in :mod:`eoguard.store.outbox_types`.

Every operation is a Lua script (``eoguard/store/lua/outbox_*.lua``), called through its
binding (:mod:`eoguard.store.bindings.outbox`). A producer's writes
and publish marks (``outbox_write.lua``) cover every shard of a batch in one script call (one
AOF fsync per batch), except on Redis Cluster, where a script's keys must share a slot:
there a batch sends one call per shard, pipelined in one round trip. The consumer's acks
do the same (one call, or one per shard on a cluster); resend claims and sweeps send one call
per shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from redis.cluster import RedisCluster

from eoguard.modes import KeepUntil
from eoguard.store.bindings.outbox import (
    OutboxAck,
    OutboxClaimForResend,
    OutboxWrite,
    PutGroup,
    ShardIds,
    WriteReply,
)
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
)
from eoguard.store.scripts import ScriptCall, Scripts

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

    def _shard_ids(self, groups: Mapping[int, list[str]]) -> list[ShardIds]:
        """Ids by shard as the scripts' bindings take them: with their keys' shard index and
        record prefix."""
        return [ShardIds(self.keys.outbox_index(shard), self._record_prefix(shard, ids[0]), ids)
                for shard, ids in groups.items()]

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
        ordered: list[list[OutboxEntry]] = []  # per call, the entries it stores, in order
        for mark_groups, put_groups in chunks:
            stored = [PutGroup(self.keys.outbox_index(shard),
                               self._record_prefix(shard, members[0].id), members)
                      for shard, members in put_groups.items()]
            calls.append(OutboxWrite.build(
                owner=owner, resend_after_ms=resend_after_ms, keep_until=keep_until,
                max_ttl_ms=self.keys.max_ttl_ms, marks=self._shard_ids(mark_groups), puts=stored))
            in_call: list[OutboxEntry] = []
            for group in stored:
                in_call += group.entries
            ordered.append(in_call)
        replies = [OutboxWrite.parse(reply)
                   for reply in self.scripts.run(calls, doing="writing the outbox")]
        return (_put_result(records, ordered, replies),
                PublishResult(kept=sum(r.kept for r in replies),
                              deleted=sum(r.deleted for r in replies),
                              missing=sum(r.missing for r in replies)))

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
        groups = self._shard_ids(self._by_shard(ids))
        if self.per_shard:
            return [OutboxAck.build([group]) for group in groups]
        return [OutboxAck.build(groups)] if groups else []

    def ack(self, ids: Iterable[str]) -> int:
        """The consumer's end-to-end ack: delete the records; returns how many existed."""
        replies = self.scripts.run(self.ack_calls(ids), doing="acknowledging outbox records")
        return sum(OutboxAck.parse(reply) for reply in replies)

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
                calls.append(OutboxClaimForResend.build(
                    group=self._shard_ids({shard: ids})[0], claimer=claimer,
                    resend_after_ms=resend_after_ms, live_read_at_ms=live_read_at_ms, live=live))
                called.append((shard, len(ids)))
            replies = self.scripts.run(calls, doing="claiming outbox records for resend")
            # Step 3.
            for (shard, n), reply in zip(called, map(OutboxClaimForResend.parse, replies),
                                         strict=True):
                records += reply.claimed
                swept += reply.swept
                expired += reply.expired
                scanned += n
                if n < page_size:
                    del offsets[shard]
                else:
                    offsets[shard] += n - len(reply.claimed) - reply.swept - reply.expired
        return ClaimBatch(records=records, swept=swept, expired=expired, scanned=scanned)

    def claim_ids_for_resend(self, ids: Sequence[str], *, claimer: str,
                             live_owners: Iterable[str], live_read_at_ms: int,
                             resend_after_ms: int) -> ClaimBatch:
        """:meth:`claim_for_resend` for the named records only (``eoguard outbox resend ID``).

        Same script, same compare-and-set: a record is taken only if pending, unexpired, and
        due or owned by an owner not in ``live_owners``; absent ones are skipped.
        """
        live = sorted(set(live_owners))
        calls = [OutboxClaimForResend.build(group=group, claimer=claimer,
                                            resend_after_ms=resend_after_ms,
                                            live_read_at_ms=live_read_at_ms, live=live)
                 for group in self._shard_ids(self._by_shard(dict.fromkeys(ids)))]
        replies = [OutboxClaimForResend.parse(reply) for reply in
                   self.scripts.run(calls, doing="claiming outbox records for resend")]
        return ClaimBatch(records=[rec for r in replies for rec in r.claimed],
                          swept=sum(r.swept for r in replies),
                          expired=sum(r.expired for r in replies), scanned=len(ids))

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
                replies: list[WriteReply]) -> PutResult:
    """What ``outbox_write`` stored, found present and found expired, from its replies (each
    lists the entries it did not store by their position in its call)."""
    existing: list[OutboxEntry] = []
    expired: list[str] = []
    refused: set[int] = set()  # by identity: two entries of one id may differ in fate
    for in_call, reply in zip(ordered, replies, strict=True):
        for position, code in reply.refused:
            entry = in_call[position - 1]
            refused.add(id(entry))
            if code == 0:
                existing.append(entry)
            else:
                expired.append(entry.id)
    return PutResult(stored=[r.id for r in records if id(r) not in refused],
                     existing=[e.id for e in existing], expired=expired,
                     existing_entries=existing)
