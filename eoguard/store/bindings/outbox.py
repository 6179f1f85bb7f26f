"""Bindings of the outbox scripts (``lua/outbox_*.lua``): calls built from typed shard groups,
replies read into typed results for :class:`eoguard.store.outbox.Outbox`.

``outbox_write`` runs per producer batch and ``outbox_ack`` per consumer batch: their builds
keep one loop per message that appends its key (and, for a write, extends a flat argv with
its ``StoredArgs``), writing rows inline in the order of their row types;
tests/unit/test_bindings.py reads every field back by name, pinning them to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from eoguard.modes import KeepUntil
from eoguard.store.bindings.layout import Binding, Contract, Each, Fixed, Layout, Rest, Returns, Row, Run
from eoguard.store.client import reply_text
from eoguard.store.outbox_types import ClaimedRecord, OutboxEntry, parse_record, record_body
from eoguard.store.scripts import ScriptArg, ScriptCall

__all__ = [
    "OutboxAck",
    "OutboxClaimForResend",
    "OutboxSweep",
    "OutboxWrite",
    "PutGroup",
    "ResendReply",
    "ShardIds",
    "WriteReply",
]

_GROUPS = Rest("groups", rows=(Row("group", ("index", "records"), rest=True),))


class ShardIds(NamedTuple):
    """One shard's message ids, and where their keys live."""

    outbox_index: str  # KeySpace.outbox_index
    record_prefix: str  # a record's key without its id
    ids: list[str]


class PutGroup(NamedTuple):
    """One shard's messages to store."""

    outbox_index: str
    record_prefix: str
    entries: list[OutboxEntry]


# outbox_write ------------------------------------------------------------------------------
class WriteHead(NamedTuple):
    """The arguments an ``outbox_write`` call opens with (written inline)."""

    owner: str
    resend_after_ms: int
    keep_until: str
    mark_groups: int
    put_groups: int
    max_ttl_ms: int


class StoredArgs(NamedTuple):
    """A stored message's arguments (written inline by :meth:`OutboxWrite.build`)."""

    expires_at_ms: int
    body: bytes


class WriteReply(NamedTuple):
    """An ``outbox_write`` call's reply."""

    now_ms: int
    kept: int
    deleted: int
    missing: int
    stored: int
    refused: list[tuple[int, int]]  # per message not stored: its position, 0 or -1


class OutboxWrite(Binding):
    """``outbox_write``: publish marks and new pending records, any number of shards."""

    contract = Contract(
        "outbox_write",
        keys=Layout(_GROUPS),
        argv=Layout(Fixed(WriteHead._fields), Run("count", "g"), Run("prefix_length", "g"),
                    Each(StoredArgs._fields, "n", "i")),
        returns=Returns(WriteReply._fields, rest=True, rows=(Row("refused", ("position", "code")),)))

    @classmethod
    def build(cls, *, owner: str, resend_after_ms: int, keep_until: KeepUntil, max_ttl_ms: int,
              marks: Sequence[ShardIds], puts: Sequence[PutGroup]) -> ScriptCall:
        keys: list[str] = []
        args: list[ScriptArg] = [owner, resend_after_ms, keep_until.value, len(marks), len(puts),
                                 max_ttl_ms]  # WriteHead
        args += [len(group.ids) for group in marks]
        args += [len(group.entries) for group in puts]
        args += [len(group.record_prefix) for group in marks]
        args += [len(group.record_prefix) for group in puts]
        for group in marks:
            keys.append(group.outbox_index)
            keys += [group.record_prefix + i for i in group.ids]
        keep = keep_until.value.encode()
        for put in puts:
            keys.append(put.outbox_index)
            prefix = put.record_prefix
            for rec in put.entries:
                keys.append(prefix + rec.id)
                args += (rec.expires_at_ms, record_body(rec, keep))  # StoredArgs
        return cls.call(keys, args)

    @staticmethod
    def parse(reply: Sequence[Any]) -> WriteReply:
        return WriteReply(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]),
                          int(reply[4]),
                          [(int(reply[i]), int(reply[i + 1])) for i in range(5, len(reply), 2)])


# outbox_ack --------------------------------------------------------------------------------
class OutboxAck(Binding):
    """``outbox_ack``: the consumer scope's end-to-end acknowledgement, any number of shards."""

    contract = Contract(
        "outbox_ack",
        keys=Layout(_GROUPS),
        argv=Layout(Fixed(("shards",)), Run("count", "n"), Rest("ids")),
        returns=Returns(("deleted",), listed=False))

    @classmethod
    def build(cls, groups: Sequence[ShardIds]) -> ScriptCall:
        keys: list[str] = []
        ids: list[str] = []
        for group in groups:
            prefix = group.record_prefix
            keys.append(group.outbox_index)
            keys += [prefix + i for i in group.ids]
            ids += group.ids
        return cls.call(keys, [len(groups), *(len(group.ids) for group in groups), *ids])

    @staticmethod
    def parse(reply: Any) -> int:
        return int(reply)


# outbox_claim_for_resend -------------------------------------------------------------------
class ResendHead(NamedTuple):
    """The arguments an ``outbox_claim_for_resend`` call opens with."""

    claimer: str
    resend_after_ms: int
    live_read_at_ms: int
    live_count: int


class ClaimedItems(NamedTuple):
    """What ``claimed`` lists per record claimed."""

    id: bytes
    previous_owner: bytes
    record: bytes


class ResendReply(NamedTuple):
    """An ``outbox_claim_for_resend`` call's reply, its records parsed."""

    now_ms: int
    swept: int
    expired: int
    claimed: list[ClaimedRecord]


class OutboxClaimForResend(Binding):
    """``outbox_claim_for_resend``: take over the due or orphaned records of one shard."""

    contract = Contract(
        "outbox_claim_for_resend",
        keys=Layout(Fixed(("index",)), Rest("record")),
        argv=Layout(Fixed(ResendHead._fields), Run("live", "l"), Rest("ids")),
        returns=Returns(ResendReply._fields, rest=True,
                        rows=(Row("claimed", ClaimedItems._fields),)))

    @classmethod
    def build(cls, *, group: ShardIds, claimer: str, resend_after_ms: int, live_read_at_ms: int,
              live: Sequence[str]) -> ScriptCall:
        keys = [group.outbox_index, *(group.record_prefix + i for i in group.ids)]
        return cls.call(keys, [*ResendHead(claimer, resend_after_ms, live_read_at_ms, len(live)),
                               *live, *group.ids])

    @staticmethod
    def parse(reply: Sequence[Any]) -> ResendReply:
        return ResendReply(int(reply[0]), int(reply[1]), int(reply[2]),
                           [_claimed(ClaimedItems._make(item)) for item in reply[3:]])


def _claimed(item: ClaimedItems) -> ClaimedRecord:
    f = parse_record(bytes(item.record))
    return ClaimedRecord(id=reply_text(item.id), topic=f.topic, key=f.key, value=f.value,
                         headers=f.headers, attempt=f.attempt, keep_until=f.keep_until,
                         expires_at_ms=f.expires_at_ms, previous_owner=reply_text(item.previous_owner))


# outbox_sweep ------------------------------------------------------------------------------
class OutboxSweep(Binding):
    """``outbox_sweep``: drop (or list) one shard's index entries whose record is gone."""

    contract = Contract(
        "outbox_sweep",
        keys=Layout(Fixed(("index",)), Rest("record")),
        argv=Layout(Fixed(("dry_run",)), Rest("ids")),
        returns=Returns(("ids",), listed=False))

    @classmethod
    def build(cls, *, index: str, records: Sequence[str], ids: Sequence[str], dry_run: bool
              ) -> ScriptCall:
        return cls.call([index, *records], ["1" if dry_run else "0", *ids])

    @staticmethod
    def parse(reply: Sequence[Any]) -> list[str]:
        return [reply_text(i) for i in reply]
