"""The outbox and liveness scripts against the real Redis: every operation and transition."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from eoguard.config import KeepUntil
from eoguard.envelope import new_message_id, now_ms
from eoguard.errors import StoreUnavailableError
from eoguard.store.keys import KeySpace
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox, OutboxRecord, RecordState
from eoguard.store.outbox_types import parse_record
from eoguard.store.scripts import ScriptCall, Scripts
from tests.conftest import free_port

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


@pytest.fixture
def keys(key_prefix: str) -> KeySpace:
    return KeySpace(prefix=key_prefix, shards=4)


@pytest.fixture
def outbox(redis_client: redis.Redis, keys: KeySpace) -> Outbox:
    return Outbox(redis_client, keys)


def record(*, ttl_ms: int = HOUR_MS, key: bytes | None = b"k", topic: str = "orders",
           headers: dict[str, str] | None = None) -> OutboxRecord:
    created = now_ms()
    return OutboxRecord(id=new_message_id(), topic=topic, key=key, value=b"\xc3\x01value-" + key
                        if key else b"\xc3\x01value", headers=headers, created_at_ms=created,
                        expires_at_ms=created + ttl_ms)


def put(outbox: Outbox, recs: list[OutboxRecord], *, owner: str = "p1",
        keep: KeepUntil = KeepUntil.CONSUMED, resend_after_ms: int = 60_000) -> None:
    result = outbox.put(recs, owner=owner, keep_until=keep, resend_after_ms=resend_after_ms)
    assert sorted(result.stored) == sorted(r.id for r in recs)


def test_put_stores_pending_records_with_ttl_equal_to_expires_at(
        outbox: Outbox, keys: KeySpace, redis_client: redis.Redis) -> None:
    recs = [record(ttl_ms=HOUR_MS + i * 1000, key=None if i == 0 else f"k{i}".encode(),
                   headers={"h": "v"} if i == 1 else None) for i in range(40)]
    before = now_ms()
    put(outbox, recs, resend_after_ms=60_000)
    for rec in recs:
        stored = outbox.get(rec.id)
        assert stored is not None
        assert stored.state is RecordState.PENDING
        assert (stored.topic, stored.key, stored.value) == (rec.topic, rec.key, rec.value)
        assert stored.headers == (rec.headers or {})
        assert (stored.owner, stored.attempt, stored.keep_until) == ("p1", 1, KeepUntil.CONSUMED)
        assert stored.expires_at_ms == rec.expires_at_ms
        assert before - 50 <= stored.owned_at_ms <= now_ms() + 50
        assert stored.next_resend_at_ms == stored.owned_at_ms + 60_000
    # TTL of every record key is exactly expires_at.
    assert outbox.expire_times([r.id for r in recs]) == {r.id: r.expires_at_ms for r in recs}
    # Each shard's index holds its records by next-resend time and expires with its last one.
    pending = outbox.pending_ids()
    assert sorted(i for ids in pending.values() for i in ids) == sorted(r.id for r in recs)
    for shard, ids in pending.items():
        latest = max(r.expires_at_ms for r in recs if r.id in ids)
        assert redis_client.execute_command("PEXPIRETIME", keys.outbox_index(shard)) == latest
        for message_id in ids:
            score = redis_client.zscore(keys.outbox_index(shard), message_id)
            assert score == outbox.get(message_id).next_resend_at_ms  # type: ignore[union-attr]


def test_put_leaves_existing_records_and_refuses_expired_ones(outbox: Outbox) -> None:
    first = record()
    put(outbox, [first])
    outbox.mark_published([first.id], keep_until=KeepUntil.CONSUMED)
    dead = OutboxRecord(id=new_message_id(), topic="t", key=None, value=b"v",
                        created_at_ms=now_ms() - 2000, expires_at_ms=now_ms() - 1000)
    result = outbox.put([first, dead], owner="p2", keep_until=KeepUntil.CONSUMED,
                        resend_after_ms=1000)
    assert (result.stored, result.existing, result.expired) == ([], [first.id], [dead.id])
    again = outbox.get(first.id)
    assert again is not None
    assert (again.state, again.owner) == (RecordState.PUBLISHED, "p1")  # untouched
    assert outbox.get(dead.id) is None
    assert outbox.expire_times([dead.id]) == {dead.id: -2}


@pytest.mark.cluster
def test_no_record_or_index_outlives_max_ttl_whatever_its_expires_at(
        redis_client: redis.Redis, key_prefix: str) -> None:
    """Invariant 6: records stamped by a producer clock hours ahead expire, and so does their
    index, within max_ttl by Redis's clock (PTTL); the outbox has no grace. A record within
    the bound keeps its expires_at, and one already past is refused."""
    keys = KeySpace(prefix=key_prefix, shards=1, max_ttl_ms=HOUR_MS)  # one index: every member
    outbox = Outbox(redis_client, keys)
    ahead = [record(ttl_ms=HOUR_MS + 3 * HOUR_MS + i * 60_000) for i in range(3)]
    within = record(ttl_ms=HOUR_MS - 60_000)
    dead = OutboxRecord(id=new_message_id(), topic="t", key=None, value=b"v",
                        created_at_ms=now_ms() - 2000, expires_at_ms=now_ms() - 1000)
    result = outbox.put([*ahead, within, dead], owner="p1", keep_until=KeepUntil.CONSUMED,
                        resend_after_ms=60_000)
    assert sorted(result.stored) == sorted(r.id for r in [*ahead, within])
    assert result.expired == [dead.id]
    slack_ms = 10_000  # the time this test takes, at most
    for rec in ahead:
        ttl = redis_client.pttl(keys.outbox_record(rec.id))
        assert HOUR_MS - slack_ms <= ttl <= HOUR_MS, (rec.id, ttl)
        stored = outbox.get(rec.id)
        assert stored is not None
        assert stored.expires_at_ms == rec.expires_at_ms  # as written: the TTL removes it first
    assert outbox.expire_times([within.id]) == {within.id: within.expires_at_ms}
    index_ttl = redis_client.pttl(keys.outbox_index(0))
    assert HOUR_MS - slack_ms <= index_ttl <= HOUR_MS
    # A later write of a record within the bound never pulls the index's expiry in.
    put(outbox, [record(ttl_ms=60_000)])
    assert redis_client.pttl(keys.outbox_index(0)) >= index_ttl - slack_ms
    # Publication (SETRANGE) keeps the clamped TTL.
    outbox.mark_published([ahead[0].id], keep_until=KeepUntil.CONSUMED)
    assert redis_client.pttl(keys.outbox_record(ahead[0].id)) <= HOUR_MS


def test_mark_published_keeps_record_until_consumed(outbox: Outbox) -> None:
    recs = [record() for _ in range(10)]
    put(outbox, recs, keep=KeepUntil.CONSUMED)
    result = outbox.mark_published([r.id for r in recs], keep_until=KeepUntil.CONSUMED)
    assert (result.kept, result.deleted, result.missing) == (10, 0, 0)
    for rec in recs:
        stored = outbox.get(rec.id)
        assert stored is not None
        assert RecordState.PENDING.can_become(stored.state)
        assert stored.state is RecordState.PUBLISHED
    assert outbox.pending_ids() == {}  # published records leave the index: never resent
    assert outbox.expire_times([r.id for r in recs]) == {r.id: r.expires_at_ms for r in recs}
    # The consumer's end-to-end ack deletes them.
    assert outbox.ack([r.id for r in recs]) == 10
    assert all(outbox.get(r.id) is None for r in recs)
    assert outbox.ack([r.id for r in recs]) == 0  # idempotent


def test_mark_published_deletes_when_keep_until_published(outbox: Outbox) -> None:
    recs = [record() for _ in range(10)]
    put(outbox, recs, keep=KeepUntil.PUBLISHED)
    result = outbox.mark_published([r.id for r in recs], keep_until=KeepUntil.PUBLISHED)
    assert (result.kept, result.deleted, result.missing) == (0, 10, 0)
    assert all(outbox.get(r.id) is None for r in recs)
    assert outbox.pending_ids() == {}


def test_mark_published_never_recreates_an_acked_record(outbox: Outbox) -> None:
    rec = record()
    put(outbox, [rec])
    assert outbox.ack([rec.id]) == 1  # the consumer was faster than the delivery report
    result = outbox.mark_published([rec.id], keep_until=KeepUntil.CONSUMED)
    assert (result.kept, result.deleted, result.missing) == (0, 0, 1)
    assert outbox.expire_times([rec.id]) == {rec.id: -2}


class CountingScripts(Scripts):
    """Scripts that count the script calls it sends."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.calls: list[str] = []

    def run(self, calls: Sequence[ScriptCall], *, doing: str = "running a script") -> list[Any]:
        self.calls += [c.script for c in calls]
        return super().run(calls, doing=doing)


@pytest.mark.parametrize("per_shard", [False, True], ids=["one-call", "cluster-per-shard"])
def test_write_marks_and_stores_in_one_round_trip(redis_client: redis.Redis, keys: KeySpace,
                                                  per_shard: bool) -> None:
    """Marks of acknowledged records and new records go in one script call for every shard,
    or (as on Redis Cluster, where a script's keys share one slot) one call per shard."""
    scripts = CountingScripts(redis_client)
    outbox = Outbox(redis_client, keys, scripts=scripts)
    outbox.per_shard = per_shard
    old = [record() for _ in range(30)]
    put(outbox, old, keep=KeepUntil.PUBLISHED)
    new = [record(key=None) for _ in range(30)]
    stale = OutboxRecord(id=new_message_id(), topic="t", key=None, value=b"v",
                         created_at_ms=now_ms() - 2000, expires_at_ms=now_ms() - 1000)
    scripts.calls.clear()
    stored, marked = outbox.write([*new, old[0], stale], owner="p2",
                                  keep_until=KeepUntil.PUBLISHED, resend_after_ms=60_000,
                                  published=[r.id for r in old[1:]])
    groups = (len({keys.shard_of(r.id) for r in old[1:]})  # one per shard with marks
              + len({keys.shard_of(r.id) for r in [*new, old[0], stale]}))  # and with records
    assert groups > 2
    assert scripts.calls == ["outbox_write"] * (groups if per_shard else 1)
    assert sorted(stored.stored) == sorted(r.id for r in new)
    assert (stored.existing, stored.expired) == ([old[0].id], [stale.id])
    assert (marked.kept, marked.deleted, marked.missing) == (0, 29, 0)
    assert all(outbox.get(r.id) is None for r in old[1:])
    assert outbox.get(old[0].id) is not None  # stored before, left untouched
    pending = sorted(i for ids in outbox.pending_ids().values() for i in ids)
    assert pending == sorted([old[0].id, *(r.id for r in new)])
    assert outbox.expire_times([r.id for r in new]) == {r.id: r.expires_at_ms for r in new}
    for rec in new:
        got = outbox.get(rec.id)
        assert got is not None
        assert (got.owner, got.key, got.value, got.keep_until) == (
            "p2", None, rec.value, KeepUntil.PUBLISHED)


def test_ack_of_a_pending_record_removes_it_from_the_index(outbox: Outbox) -> None:
    recs = [record() for _ in range(6)]
    put(outbox, recs)
    calls = outbox.ack_calls([r.id for r in recs[:3]])
    assert {c.script for c in calls} == {"outbox_ack"}
    assert outbox.ack([r.id for r in recs[:3]]) == 3
    left = sorted(i for ids in outbox.pending_ids().values() for i in ids)
    assert left == sorted(r.id for r in recs[3:])


@pytest.mark.cluster
def test_ack_takes_every_shard_in_one_call_on_a_single_node(outbox: Outbox,
                                                             redis_client: redis.Redis) -> None:
    recs = [record() for _ in range(4_500)]  # over 1,000 ids a shard: the script's slices
    put(outbox, recs)
    acked, kept = [r.id for r in recs[:4_400]], [r.id for r in recs[4_400:]]
    calls = outbox.ack_calls(acked)
    shards = {outbox.keys.shard_of(i) for i in acked}
    assert len(calls) == (len(shards) if outbox.per_shard else 1)
    assert max(len(outbox._by_shard(acked)[s]) for s in shards) > 1_000
    assert outbox.ack(acked) == 4_400
    assert outbox.ack(acked) == 0  # idempotent
    left = sorted(i for ids in outbox.pending_ids().values() for i in ids)
    assert left == sorted(kept)
    assert all(outbox.get(i) is None for i in acked[::97])
    assert all(outbox.get(i) is not None for i in kept)


def claim(outbox: Outbox, claimer: str, live: list[str], *, live_read_at_ms: int | None = None,
          resend_after_ms: int = 60_000):
    return outbox.claim_for_resend(claimer=claimer, live_owners=live,
                                   live_read_at_ms=live_read_at_ms or now_ms(),
                                   resend_after_ms=resend_after_ms, page_size=7)


def test_claim_takes_records_of_a_lapsed_owner_only(outbox: Outbox, keys: KeySpace,
                                                    redis_client: redis.Redis) -> None:
    dead = [record() for _ in range(20)]
    alive = [record() for _ in range(20)]
    put(outbox, dead, owner="dead")
    put(outbox, alive, owner="alive")
    time.sleep(0.01)
    batch = claim(outbox, "rescuer", ["alive", "rescuer"])
    assert sorted(r.id for r in batch.records) == sorted(r.id for r in dead)
    assert batch.scanned >= 40
    for claimed in batch.records:
        assert (claimed.attempt, claimed.previous_owner) == (2, "dead")
        original = next(r for r in dead if r.id == claimed.id)
        assert (claimed.topic, claimed.key, claimed.value) == (original.topic, original.key,
                                                                original.value)
        assert claimed.expires_at_ms == original.expires_at_ms
        stored = outbox.get(claimed.id)
        assert stored is not None
        assert (stored.owner, stored.attempt, stored.state) == ("rescuer", 2, RecordState.PENDING)
        assert stored.next_resend_at_ms == stored.owned_at_ms + 60_000
        score = redis_client.zscore(keys.outbox_index(keys.shard_of(claimed.id)), claimed.id)
        assert score == stored.next_resend_at_ms
    # A second pass finds nothing: the rescuer is live and its records are not due.
    assert claim(outbox, "other", ["alive", "rescuer"]).records == []
    # TTLs are untouched by the claim.
    assert outbox.expire_times([r.id for r in dead]) == {r.id: r.expires_at_ms for r in dead}


def test_claim_skips_records_written_after_the_live_set_was_read(outbox: Outbox) -> None:
    read_at = now_ms() - 5_000  # a live set read before this producer registered
    recs = [record() for _ in range(5)]
    put(outbox, recs, owner="newcomer")
    assert claim(outbox, "rescuer", [], live_read_at_ms=read_at).records == []


def test_claim_takes_due_records_of_a_live_owner(outbox: Outbox) -> None:
    recs = [record() for _ in range(5)]
    put(outbox, recs, owner="slow", resend_after_ms=1)  # delivery timed out at once
    time.sleep(0.02)
    batch = claim(outbox, "slow", ["slow"])  # its own records, due: resend them
    assert sorted(r.id for r in batch.records) == sorted(r.id for r in recs)
    assert {r.attempt for r in batch.records} == {2}
    assert claim(outbox, "slow", ["slow"]).records == []  # pushed to now + resend_after


def test_a_claimer_left_out_of_the_live_set_takes_its_own_records_before_they_are_due(
        outbox: Outbox) -> None:
    # A producer whose delivery failed resends its own records at once (librdkafka retries
    # nothing after the failure report); with itself in the live set it waits until due.
    recs = [record() for _ in range(5)]
    put(outbox, recs, owner="owner", resend_after_ms=600_000)
    time.sleep(0.01)
    assert claim(outbox, "owner", ["owner", "other"]).records == []
    batch = claim(outbox, "owner", ["other"])
    assert sorted(r.id for r in batch.records) == sorted(r.id for r in recs)
    assert {r.previous_owner for r in batch.records} == {"owner"}
    assert claim(outbox, "owner", ["owner"]).records == []  # pushed to now + resend_after


def test_claim_sweeps_expired_records_and_never_resends_them(
        outbox: Outbox, keys: KeySpace, redis_client: redis.Redis) -> None:
    gone = [record(ttl_ms=150) for _ in range(5)]
    put(outbox, gone, owner="dead")
    # A record Redis has not evicted yet but whose expires_at passed (clock skew, lazy expiry).
    stale = record()
    put(outbox, [stale], owner="dead")
    stale_key = keys.outbox_record(stale.id)
    raw = redis_client.get(stale_key)
    assert raw is not None
    f = parse_record(raw)
    raw = raw.replace(b":%d:%d:" % (f.created_at_ms, f.expires_at_ms),
                      b":%d:%d:" % (f.created_at_ms, now_ms() - 1), 1)
    redis_client.set(stale_key, raw, keepttl=True)
    assert parse_record(raw).expires_at_ms < now_ms()
    # A published record whose index entry was left behind.
    stray = record()
    put(outbox, [stray], owner="dead")
    outbox.mark_published([stray.id], keep_until=KeepUntil.CONSUMED)
    redis_client.zadd(keys.outbox_index(keys.shard_of(stray.id)), {stray.id: 0})
    time.sleep(0.3)
    batch = claim(outbox, "rescuer", [])
    assert batch.records == []
    # A shard's index expires with its last record; entries left in longer-lived indexes
    # are swept.
    kept_shards = {keys.shard_of(stale.id), keys.shard_of(stray.id)}
    in_kept = sum(1 for r in gone if keys.shard_of(r.id) in kept_shards)
    assert (batch.swept, batch.expired) == (in_kept, 1)
    assert outbox.get(stale.id) is None
    assert outbox.get(stray.id) is not None  # still kept for the consumer's ack
    assert outbox.pending_ids() == {}


def test_two_concurrent_claimers_never_both_take_a_record(redis_url: str, keys: KeySpace,
                                                           outbox: Outbox) -> None:
    recs = [record() for _ in range(300)]
    for i in range(0, 300, 100):
        put(outbox, recs[i:i + 100], owner="dead")
    results: dict[str, list[str]] = {}
    start = threading.Barrier(2)

    def run(name: str) -> None:
        client = redis.Redis.from_url(redis_url)
        mine = Outbox(client, keys)
        start.wait()
        taken: list[str] = []
        for _ in range(5):
            taken += [r.id for r in claim(mine, name, ["a", "b"]).records]
        results[name] = taken
        client.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = results["a"] + results["b"]
    print(f"claimer a took {len(results['a'])}, b took {len(results['b'])}")
    assert len(taken) == len(set(taken)) == 300


def test_liveness_leases(redis_client: redis.Redis, keys: KeySpace) -> None:
    live = Liveness(redis_client, keys)
    assert live.live_count() == 0
    assert live.is_lapsed("p1")
    beat = live.heartbeat("p1", 200)
    assert beat.live_count == 1
    assert live.heartbeat("p2", 10_000).live_count == 2
    current = live.live()
    assert set(current.deadlines) == {"p1", "p2"}
    assert current.deadlines["p2"] == pytest.approx(current.read_at_ms + 10_000, abs=100)
    # The set expires with its latest lease.
    assert redis_client.execute_command("PEXPIRETIME", keys.live_producers()) == \
        current.deadlines["p2"]
    time.sleep(0.3)
    assert live.is_lapsed("p1")
    assert not live.is_lapsed("p2")
    assert live.heartbeat("p3", 10_000).live_count == 2  # p1's lapsed lease is dropped
    live.deregister("p2")
    assert set(live.live().deadlines) == {"p3"}


def test_scripts_are_reloaded_after_redis_lost_them(private_redis, keys: KeySpace) -> None:
    client = redis.Redis.from_url(private_redis.address)
    outbox = Outbox(client, keys)
    put(outbox, [record()])
    client.script_flush()
    put(outbox, [record()])  # NOSCRIPT -> load -> resend, transparently
    assert sum(len(v) for v in outbox.pending_ids().values()) == 2
    client.close()


def test_unreachable_redis_is_a_typed_error(keys: KeySpace) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    outbox = Outbox(client, keys)
    with pytest.raises(StoreUnavailableError):
        outbox.put([record()], owner="p", keep_until=KeepUntil.CONSUMED, resend_after_ms=1000)
    with pytest.raises(StoreUnavailableError):
        Liveness(client, keys).heartbeat("p", 1000)
