"""The script bindings build what their contracts declare and read what they say comes back
(no Redis: calls and replies as data).

Each build is read back field by field with its contract's layout (``Layout.split``), so the
loops that write a row inline for speed (a claim's ``position, pxat``, a stored message's
``expires_at_ms, body``, a done message's row and effect commands) are pinned to the row types
the contract and the script's header declare (tests/unit/test_lua_contracts.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from eoguard.modes import KeepUntil
from eoguard.store import dedup_types
from eoguard.store.bindings.dedup import (
    ClaimArgs,
    ClaimGroup,
    DedupClaim,
    DedupDone,
    DedupRelease,
    DedupRenew,
    DoneGroup,
    DoneMessage,
    EffectCommand,
    ReleaseGroup,
)
from eoguard.store.bindings.layout import Each, Fixed, Layout, Rest, Run
from eoguard.store.bindings.liveness import LiveHeartbeat, LiveRead
from eoguard.store.bindings.outbox import (
    OutboxAck,
    OutboxClaimForResend,
    OutboxSweep,
    OutboxWrite,
    PutGroup,
    ShardIds,
    StoredArgs,
)
from eoguard.store.dedup_types import Claim, ClaimResult, DoneResult, Effect, ReleaseResult
from eoguard.store.outbox_types import OutboxRecord, record_body

GRACE = 5
CLAIMS = [Claim(f"id{i}", f"pos{i}", 1_000 + i, i % 2, f"key{i}") for i in range(5)]
# Two shards: claims 0, 2, 4 on the first, 1 and 3 on the second (the keys in that order).
CLAIM_GROUPS = [([0, 2, 4], "a"), ([1, 3], "b")]


def rows(values: dict[str, list[Any]], fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The rows of an ``Each`` section, from its fields' columns."""
    return list(zip(*(values[name] for name in fields), strict=True))


def test_layout_renders_each_position_from_the_fields_before_it() -> None:
    layout = Layout(Fixed(("a", "b")), Run("c", "g"), Each(("d", "e"), "n", "i"), Fixed(("f",)),
                    Rest("z"))
    assert layout.entries() == [("1", "a"), ("2", "b"), ("3..2+g", "c"), ("1+g+2i", "d"),
                                ("2+g+2i", "e"), ("3+g+2n", "f"), ("4+g+2n..", "z")]
    assert layout.split([1, 2, "c1", "d1", "e1", "d2", "e2", "f", "z1", "z2"], {"g": 1, "n": 2}) \
        == {"a": [1], "b": [2], "c": ["c1"], "d": ["d1", "d2"], "e": ["e1", "e2"], "f": ["f"],
            "z": ["z1", "z2"]}
    with pytest.raises(ValueError, match="left over"):
        Layout(Fixed(("a",))).split([1, 2], {})
    with pytest.raises(ValueError, match="too few"):
        layout.split([1, 2], {"g": 1, "n": 2})
    with pytest.raises(ValueError, match="last"):
        Layout(Rest("z"), Fixed(("a",)))


def claim_groups() -> list[ClaimGroup]:
    return [ClaimGroup(f"rec:{s}", f"passed:{s}", f"rec:{s}:", f"reowned:{s}:", members,
                       [CLAIMS[i].key for i in members]) for members, s in CLAIM_GROUPS]


def test_claim_lays_out_every_field_and_each_claims_row() -> None:
    call = DedupClaim.build(token="t", lease_ms=30_000, grace_ms=GRACE, max_ttl_ms=99,
                            give_up_busy=True, groups=claim_groups(), claims=CLAIMS)
    contract = DedupClaim.contract
    assert call.script == contract.script
    counts = {"g": 2, "n": 5}
    assert contract.keys.split(call.keys, counts) == {
        "record": ["rec:a", "rec:b"], "passed": ["passed:a", "passed:b"],
        "claim_key": ["key0", "key2", "key4", "key1", "key3"], "asked": []}
    argv = contract.argv.split(call.args, counts)
    assert {name: argv[name] for name in contract.argv.fields[:9]} == {
        "token": ["t"], "lease_ms": [30_000], "grace_ms": [GRACE], "max_ttl_ms": [99],
        "groups": [2], "give_up_busy": [1], "record_prefix": ["rec:a:", "rec:b:"],
        "reowned_prefix": ["reowned:a:", "reowned:b:"], "claims": [3, 2]}
    in_key_order = [CLAIMS[i] for i in (0, 2, 4, 1, 3)]
    assert rows(argv, ClaimArgs._fields) == [
        ClaimArgs(position=c.position, pxat=c.expires_at_ms + GRACE) for c in in_key_order]


def test_claim_reads_codes_and_busy_items_into_batch_order() -> None:
    order = [0, 2, 4, 1, 3]
    replies = [[b"040", [7_000, b"other"]], [b"84", [9_000, b"third"]]]
    report = DedupClaim.parse(replies, order, 5)
    assert report.results == [ClaimResult.NEW, ClaimResult.PASSED, ClaimResult.BUSY,
                              ClaimResult.BUSY, ClaimResult.NEW]
    assert report.lease_ms == {2: 7_000, 3: 9_000}
    assert report.holders == {2: "other", 3: "third"}


def done_groups(latest: int = 0) -> list[DoneGroup]:
    return [DoneGroup(f"rec:{s}", f"reowned:{s}", members, [CLAIMS[i].key for i in members],
                      latest + len(s)) for members, s in CLAIM_GROUPS]


def test_simple_done_passes_no_claim() -> None:
    call = DedupDone.build(token="t", groups=done_groups(100), bound_ms=77, simple=True,
                           claims=CLAIMS)
    contract = DedupDone.contract
    counts = {"g": 2, "n": 0, "e": 0}
    assert contract.keys.split(call.keys, counts) == {
        "record": ["rec:a", "rec:b"], "reowned": ["reowned:a", "reowned:b"], "claim_key": [],
        "effect_key": [], "asked": []}
    assert contract.argv.split(call.args, counts) == {
        "token": ["t"], "groups": [2], "claims": [0], "count": [0, 0], "latest_pxat": [101, 101],
        "bound_ms": [77], "simple": [1], "messages": []}


def test_done_lays_out_each_message_row_and_its_effect_commands() -> None:
    handled = [True, False, True, True, True]
    effects = {"id2": [Effect("incrby", "fx:1", (3,)), Effect("set", "fx:2", ("v", "NX"))],
               "id1": [Effect("del", "fx:3")],  # let go: its effects are not sent
               "id3": [Effect("del", "fx:1")]}
    call = DedupDone.build(token="t", groups=done_groups(), bound_ms=77, simple=False,
                           claims=CLAIMS, handled=handled, effects=effects)
    contract = DedupDone.contract
    counts = {"g": 2, "n": 5, "e": 2}
    keys = contract.keys.split(call.keys, counts)
    assert keys["claim_key"] == ["key0", "key2", "key4", "key1", "key3"]
    assert keys["effect_key"] == ["fx:1", "fx:2"]
    argv = contract.argv.split(call.args, counts)
    assert (argv["claims"], argv["count"], argv["simple"]) == ([5], [3, 2], [0])
    messages = []
    values, at = argv["messages"], 0
    while at < len(values):
        message = DoneMessage(*values[at:at + 3])
        at += 3
        commands = []
        for _ in range(message.commands):
            argc = values[at + 2]
            commands.append(EffectCommand(*values[at:at + 3], tuple(values[at + 3:at + 3 + argc])))
            at += 3 + argc
        messages.append((message, commands))
    first_effect = 2 * 2 + 5 + 1  # KEYS index of fx:1: after records, hashes and claim keys
    assert messages == [
        (DoneMessage("pos0", 1, 0), []),
        (DoneMessage("pos2", 1, 2), [EffectCommand("INCRBY", first_effect, 1, (3,)),
                                     EffectCommand("SET", first_effect + 1, 2, ("v", "NX"))]),
        (DoneMessage("pos4", 1, 0), []),
        (DoneMessage("pos1", 0, 0), []),
        (DoneMessage("pos3", 1, 1), [EffectCommand("DEL", first_effect, 0, ())])]


def test_done_reads_codes_reasons_and_reowned_keys_into_batch_order() -> None:
    replies = [[b"", [], [b"key3", b"1"]],  # simple: only the re-owned keys not settled OK
               [b"305", [b"refused", b"partial"], []]]
    report = DedupDone.parse(replies, [True, False], [[1, 3], [0, 2, 4]], 5,
                             lambda i: CLAIMS[i].key)
    assert report.results == [DoneResult.EFFECT_ERROR, DoneResult.OK, DoneResult.OK,
                              DoneResult.NOT_OWNED, DoneResult.PARTIAL]
    assert report.details == {0: "refused", 4: "partial"}


def test_release_and_renew() -> None:
    call = DedupRelease.build(token="t", groups=[
        ReleaseGroup(f"rec:{s}", [CLAIMS[i].key for i in members]) for members, s in CLAIM_GROUPS])
    contract = DedupRelease.contract
    assert contract.keys.split(call.keys, {"g": 2, "n": 5})["record"] == ["rec:a", "rec:b"]
    assert contract.argv.split(call.args, {"g": 2}) == {"token": ["t"], "groups": [2],
                                                        "count": [3, 2]}
    assert DedupRelease.parse([b"012", b"10"], [0, 2, 4, 1, 3], 5) == [
        ReleaseResult.OK, ReleaseResult.NOT_OWNED, ReleaseResult.NOT_OWNED, ReleaseResult.OK,
        ReleaseResult.ALREADY_DONE]
    call = DedupRenew.build(records=["r1", "r2"], lease_ms=0)
    assert DedupRenew.contract.keys.split(call.keys, {"n": 2}) == {"record": ["r1", "r2"]}
    assert DedupRenew.contract.argv.split(call.args, {}) == {"lease_ms": [0]}
    assert DedupRenew.parse([b"2", b"10"], [[1], [2, 0]], 3) == [
        dedup_types.RenewResult.ABSENT, dedup_types.RenewResult.DONE,
        dedup_types.RenewResult.RENEWED]


def entry(n: int, expires_at_ms: int = 5_000) -> OutboxRecord:
    return OutboxRecord(id=f"m{n}", topic="t", key=None, value=b"v%d" % n, created_at_ms=1,
                        expires_at_ms=expires_at_ms + n)


def group_rows(keys: list[str]) -> list[list[str]]:
    """KEYS of the outbox scripts' groups, split at each index: [group: index, records...]."""
    out: list[list[str]] = []
    for key in keys:
        if key.startswith("idx:"):
            out.append([key])
        else:
            out[-1].append(key)
    return out


def test_write_lays_out_marks_puts_and_each_stored_messages_row() -> None:
    puts = [PutGroup("idx:1", "r:1:", [entry(1), entry(2)]), PutGroup("idx:2", "r:22:", [entry(3)])]
    call = OutboxWrite.build(owner="p", resend_after_ms=60, keep_until=KeepUntil.CONSUMED,
                             max_ttl_ms=99, marks=[ShardIds("idx:0", "r:0:", ["m8", "m9"])],
                             puts=puts)
    contract = OutboxWrite.contract
    assert group_rows(contract.keys.split(call.keys, {})["groups"]) == [
        ["idx:0", "r:0:m8", "r:0:m9"], ["idx:1", "r:1:m1", "r:1:m2"], ["idx:2", "r:22:m3"]]
    argv = contract.argv.split(call.args, {"g": 3, "n": 3})
    assert {name: argv[name] for name in contract.argv.fields[:8]} == {
        "owner": ["p"], "resend_after_ms": [60], "keep_until": ["consumed"], "mark_groups": [1],
        "put_groups": [2], "max_ttl_ms": [99], "count": [2, 2, 1], "prefix_length": [4, 4, 5]}
    assert rows(argv, StoredArgs._fields) == [
        StoredArgs(rec.expires_at_ms, record_body(rec, b"consumed"))
        for rec in (entry(1), entry(2), entry(3))]
    reply = OutboxWrite.parse([b"10", b"1", b"2", b"3", b"1", b"2", b"0", b"3", b"-1"])
    assert reply == (10, 1, 2, 3, 1, [(2, 0), (3, -1)])


def test_ack_claim_for_resend_and_sweep() -> None:
    groups = [ShardIds("idx:0", "r:0:", ["a", "b"]), ShardIds("idx:1", "r:1:", ["c"])]
    call = OutboxAck.build(groups)
    assert group_rows(OutboxAck.contract.keys.split(call.keys, {})["groups"]) == [
        ["idx:0", "r:0:a", "r:0:b"], ["idx:1", "r:1:c"]]
    assert OutboxAck.contract.argv.split(call.args, {"n": 2}) == {
        "shards": [2], "count": [2, 1], "ids": ["a", "b", "c"]}
    assert OutboxAck.parse(b"3") == 3

    call = OutboxClaimForResend.build(group=groups[0], claimer="p2", resend_after_ms=60,
                                      live_read_at_ms=40, live=["p1", "p3"])
    contract = OutboxClaimForResend.contract
    assert contract.keys.split(call.keys, {}) == {"index": ["idx:0"], "record": ["r:0:a", "r:0:b"]}
    assert contract.argv.split(call.args, {"l": 2}) == {
        "claimer": ["p2"], "resend_after_ms": [60], "live_read_at_ms": [40], "live_count": [2],
        "live": ["p1", "p3"], "ids": ["a", "b"]}
    record = b"0:50:110:2:p2" + record_body(entry(1), b"published")
    reply = OutboxClaimForResend.parse([b"50", b"1", b"0", [b"m1", b"p1", record]])
    assert reply[:3] == (50, 1, 0)
    [claimed] = reply.claimed
    assert (claimed.id, claimed.previous_owner, claimed.value, claimed.attempt) == (
        "m1", "p1", b"v1", 1)

    call = OutboxSweep.build(index="idx:0", records=["r:0:a"], ids=["a"], dry_run=True)
    assert OutboxSweep.contract.keys.split(call.keys, {}) == {"index": ["idx:0"], "record": ["r:0:a"]}
    assert OutboxSweep.contract.argv.split(call.args, {}) == {"dry_run": ["1"], "ids": ["a"]}
    assert OutboxSweep.parse([b"a"]) == ["a"]


def test_liveness() -> None:
    call = LiveHeartbeat.build(live_set="live", instance_id="p1", lease_ms=9)
    assert LiveHeartbeat.contract.argv.split(call.args, {}) == {"instance_id": ["p1"],
                                                                "lease_ms": [9]}
    assert LiveHeartbeat.parse([b"5", b"2"]).live_count == 2
    call = LiveRead.build(live_set="live")
    assert (call.keys, call.args) == (["live"], [])
    live = LiveRead.parse([b"5", b"p1", b"30", b"p2", b"40"])
    assert (live.read_at_ms, live.deadlines) == (5, {"p1": 30, "p2": 40})


@pytest.mark.parametrize(("reason", "full"), [
    ("HINCRBY p:fx:{s/1}:n (command 1 of 2) failed: OOM command not allowed when used memory > "
     "'maxmemory'.; nothing applied", True),
    ("HSET p:fx:{s/1}:OOM command not allowed (command 1 of 1): key holds a string, not a hash; "
     "nothing applied", False),  # the check's refusal: the key quotes OOM, Redis did not
    ("SET p:fx:{s/1}:x) failed: OOM command not allowed (command 1 of 1) failed: WRONGTYPE "
     "Operation against a key holding the wrong kind of value; nothing applied", False),
    ("", False),
])
def test_a_refusal_for_memory_is_judged_by_the_error_redis_gave(reason: str, full: bool) -> None:
    report = dedup_types.DoneReport([DoneResult.EFFECT_ERROR], {0: reason})
    assert report.refused_for_memory(0) is full
