"""The outbox: one Redis hash per message not yet known to be consumed, TTL = expires_at.

A record goes ``pending`` (written by the producer) -> ``published`` (Kafka acknowledged;
kept only with ``keep_until=consumed``) -> deleted (the consumer's end-to-end ack, or at
publication with ``keep_until=published``); its TTL deletes it at ``expires_at`` in every
case. Each shard's index (a sorted set by next-resend time) holds the pending records only,
so a published record is never resent however slow its consumer is.

Every operation is one Lua script per shard (``eoguard/store/lua/outbox_*.lua``); a batch's
calls for all shards go out pipelined in one round trip.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eoguard.config import KeepUntil
from eoguard.store.client import RedisClient
from eoguard.store.keys import KeySpace
from eoguard.store.outbox_types import (
    ClaimBatch,
    ClaimedRecord,
    OutboxRecord,
    PublishResult,
    PutResult,
    RecordState,
    StoredRecord,
)
from eoguard.store.scripts import ScriptArg, ScriptCall, Scripts

__all__ = [
    "ClaimBatch",
    "ClaimedRecord",
    "Outbox",
    "OutboxRecord",
    "PublishResult",
    "PutResult",
    "RecordState",
    "StoredRecord",
]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _headers(raw: Any) -> dict[str, str]:
    return dict(json.loads(raw)) if raw else {}


class Outbox:
    """Typed wrappers over the outbox scripts for one :class:`KeySpace`."""

    def __init__(self, client: RedisClient, keys: KeySpace, *,
                 scripts: Scripts | None = None) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts or Scripts(client)

    # Grouping ------------------------------------------------------------------------
    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = defaultdict(list)
        for message_id in ids:
            groups[self.keys.shard_of(message_id)].append(message_id)
        return groups

    def _per_shard_calls(self, script: str, ids: Iterable[str]) -> list[ScriptCall]:
        return [
            ScriptCall(script, [self.keys.outbox_index(shard),
                                *(self.keys.outbox_record(i) for i in members)], members)
            for shard, members in self._by_shard(ids).items()
        ]

    # Put -------------------------------------------------------------------------------
    def put(self, records: Sequence[OutboxRecord], *, owner: str, keep_until: KeepUntil,
            resend_after_ms: int) -> PutResult:
        """Store ``records`` as pending, owned by ``owner``: one round trip for the batch."""
        groups: dict[int, list[OutboxRecord]] = defaultdict(list)
        for rec in records:
            groups[self.keys.shard_of(rec.id)].append(rec)
        calls = []
        for shard, members in groups.items():
            args: list[ScriptArg] = [owner, resend_after_ms, keep_until.value]
            for rec in members:
                args += (rec.id, rec.topic, b"" if rec.key is None else b"k" + rec.key,
                         rec.value, json.dumps(dict(rec.headers)) if rec.headers else "",
                         rec.attempt, rec.created_at_ms, rec.expires_at_ms)
            keys = [self.keys.outbox_index(shard), *(self.keys.outbox_record(r.id) for r in members)]
            calls.append(ScriptCall("outbox_put", keys, args))
        replies = self.scripts.run(calls, doing="writing the outbox")
        stored: list[str] = []
        existing: list[str] = []
        expired: list[str] = []
        for members, reply in zip(groups.values(), replies, strict=True):
            for rec, code in zip(members, reply[1:], strict=True):
                (stored if code == 1 else existing if code == 0 else expired).append(rec.id)
        return PutResult(stored=stored, existing=existing, expired=expired)

    # Publication and acknowledgement --------------------------------------------------
    def mark_published(self, ids: Iterable[str]) -> PublishResult:
        """Kafka acknowledged ``ids``: leave the index; keep as published or delete."""
        replies = self.scripts.run(self._per_shard_calls("outbox_mark_published", ids),
                                   doing="marking outbox records published")
        return PublishResult(kept=sum(int(r[0]) for r in replies),
                             deleted=sum(int(r[1]) for r in replies),
                             missing=sum(int(r[2]) for r in replies))

    def ack_calls(self, ids: Iterable[str]) -> list[ScriptCall]:
        """The script calls of :meth:`ack`, for a caller that pipelines them with its own."""
        return self._per_shard_calls("outbox_ack", ids)

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
                ids = [_text(m) for m in page]
                if not ids:
                    del offsets[shard]
                    continue
                keys = [self.keys.outbox_index(shard), *(self.keys.outbox_record(i) for i in ids)]
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
        groups = self._by_shard(dict.fromkeys(ids))
        calls = [ScriptCall("outbox_claim_for_resend",
                            [self.keys.outbox_index(shard),
                             *(self.keys.outbox_record(i) for i in members)],
                            [claimer, resend_after_ms, live_read_at_ms, len(live), *live, *members])
                 for shard, members in groups.items()]
        replies = self.scripts.run(calls, doing="claiming outbox records for resend")
        return ClaimBatch(records=[self._claimed(item) for r in replies for item in r[3:]],
                          swept=sum(int(r[1]) for r in replies),
                          expired=sum(int(r[2]) for r in replies), scanned=len(ids))

    @staticmethod
    def _claimed(item: Sequence[Any]) -> ClaimedRecord:
        has_key = _text(item[3]) == "1"
        return ClaimedRecord(id=_text(item[0]), topic=_text(item[1]),
                             key=bytes(item[2]) if has_key else None, value=bytes(item[4]),
                             headers=_headers(item[5]), attempt=int(item[6]),
                             expires_at_ms=int(item[7]), previous_owner=_text(item[8]))

    # Inspection ------------------------------------------------------------------------
    def get(self, message_id: str) -> StoredRecord | None:
        """The record of ``message_id`` as stored, or None when absent."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.outbox_record(message_id))
        raw = self.scripts.execute(pipe, doing="reading an outbox record")[0]
        if not raw:
            return None
        f = {_text(k): v for k, v in raw.items()}
        published = f.get("published_at")
        return StoredRecord(
            id=message_id, topic=_text(f["topic"]), key=f.get("key"), value=f["value"],
            headers=_headers(f.get("headers")), state=RecordState(_text(f["state"])),
            owner=_text(f["owner"]), attempt=int(f["attempt"]),
            keep_until=KeepUntil(_text(f["keep"])), created_at_ms=int(f["created_at"]),
            expires_at_ms=int(f["expires_at"]), owned_at_ms=int(f["owned_at"]),
            next_resend_at_ms=int(f["next_resend_at"]),
            published_at_ms=None if published is None else int(published),
        )

    def pending_ids(self) -> dict[int, list[str]]:
        """Every shard's index members (pending records), for tests and the CLI."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.keys.shards):
            pipe.zrange(self.keys.outbox_index(shard), 0, -1)
        pages = self.scripts.execute(pipe, doing="reading the outbox index")
        return {shard: [_text(m) for m in page] for shard, page in enumerate(pages) if page}

    def expire_times(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        """PEXPIRETIME of each record key (-2 absent, -1 no TTL), for tests and the CLI."""
        pipe = self.client.pipeline(transaction=False)
        for message_id in message_ids:
            pipe.execute_command("PEXPIRETIME", self.keys.outbox_record(message_id))
        replies = self.scripts.execute(pipe, doing="reading outbox expiry times")
        return {m: int(r) for m, r in zip(message_ids, replies, strict=True)}
