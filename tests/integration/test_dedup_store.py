"""The dedup store (v2) against real Redis: the claim rules of docs/design.md §4.

One test per rule where it reads well: claim outcomes (NEW, MINE, DONE_HERE, DUPLICATE, BUSY,
taken over, EXPIRED, STALE) and TTLs (a claim's, clamped by ``max_ttl``; a batch record's,
moved to its latest claim). Done (effects, let-go keys, re-owned keys taken back, ALREADY_DONE,
a vanished record) and fencing are in test_dedup_done.py; renew, give back, release and what a
batch costs in test_dedup_calls.py.
"""

from __future__ import annotations

import time

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.dedup import (
    DedupStore,
    DoneResult,
    IdState,
    position,
)
from eoguard.store.keys import KeySpace
from tests.dedup_kit import (
    BUSY,
    DONE_HERE,
    DUPLICATE,
    EXPIRED,
    GRACE_MS,
    LEASE_MS,
    MINE,
    NEW,
    STALE,
    claim_of,
    claim_results,
    deadline_of,
    done_results,
    gone_lapsed,
    keys_under,
    record_key,
    record_of,
    value,
)

pytestmark = pytest.mark.integration


# Claim ---------------------------------------------------------------------------------------
@pytest.mark.cluster
def test_absent_is_new_one_key_per_message_and_one_record_per_shard(
        store: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    token = store.new_token()
    claims = [claim_of(store, new_message_id(), i, ttl_ms=60_000 + i) for i in range(40)]
    before = now_ms()
    assert claim_results(store, token, claims) == [NEW] * 40
    after = now_ms()
    for claim in claims:
        assert value(redis_client, claim.key) == f"c|{token}|{claim.position}"
        assert redis_client.pexpiretime(claim.key) == claim.expires_at_ms + GRACE_MS
    records = store.records(token, claims)
    assert len(records) == len({claim.shard for claim in claims}) > 1
    for shard, key in records:
        deadline = deadline_of(value(redis_client, key))
        assert before + LEASE_MS <= deadline <= after + LEASE_MS
        latest = max(c.expires_at_ms for c in claims if c.shard == shard) + GRACE_MS
        assert redis_client.pexpiretime(key) == latest  # the latest claim it covers
    assert keys_under(redis_client, key_prefix) == {c.key for c in claims} | {k for _, k in records}


def test_located_claims_are_new_claims_with_the_shards_given(store: DedupStore) -> None:
    ids = [new_message_id() for _ in range(50)]
    where = [position("g", "orders", i % 3, i) for i in range(50)]
    expires = [now_ms() + 60_000 + i for i in range(50)]
    shards = [store.keys.shard_of(message_id) for message_id in ids]
    assert store.located_claims(ids, where, expires, shards) == [
        store.new_claim(*row) for row in zip(ids, where, expires, strict=True)]
    with pytest.raises(ValueError, match="zip"):  # columns of unequal length
        store.located_claims(ids, where[:-1], expires, shards)


def test_same_position_open_batch_is_mine_rewritten_under_the_new_token(
        store: DedupStore, redis_client: redis.Redis) -> None:
    first, second = store.new_token(), store.new_token()
    claim = claim_of(store, new_message_id(), 7)
    assert claim_results(store, first, [claim]) == [NEW]
    expire_at = redis_client.pexpiretime(claim.key)
    assert claim_results(store, first, [claim]) == [MINE]  # same token: nothing to rewrite
    assert value(redis_client, claim.key) == f"c|{first}|{claim.position}"
    # The same record read again under a new pass: MINE although the first lease is live.
    assert claim_results(store, second, [claim]) == [MINE]
    assert value(redis_client, claim.key) == f"c|{second}|{claim.position}"
    assert redis_client.pexpiretime(claim.key) == expire_at  # TTL kept
    assert record_of(redis_client, store, second, claim)[1] == expire_at
    assert record_of(redis_client, store, first, claim)[0].startswith("o|")  # type: ignore[union-attr]
    entry = store.check(claim.message_id)
    assert entry is not None
    assert entry.token == second
    assert entry.position == claim.position
    assert entry.id_state(now_ms()) is IdState.IN_PROGRESS


def test_same_position_done_batch_is_done_here(store: DedupStore,
                                               redis_client: redis.Redis) -> None:
    first, second = store.new_token(), store.new_token()
    claim = claim_of(store, new_message_id(), 7)
    store.claim(first, [claim])
    assert done_results(store, first, [claim]) == [DoneResult.OK]
    assert claim_results(store, second, [claim]) == [DONE_HERE]
    assert value(redis_client, claim.key) == f"c|{first}|{claim.position}"  # not rewritten
    assert record_of(redis_client, store, second, claim) == (None, -2)  # nothing written


def test_other_position_done_is_duplicate(store: DedupStore, redis_client: redis.Redis) -> None:
    first = store.new_token()
    mid = new_message_id()
    claim = claim_of(store, mid, 7)
    store.claim(first, [claim])
    store.done(first, [claim])
    other_offset, other_reader = claim_of(store, mid, 8), claim_of(store, mid, 7, reader="h")
    assert claim_results(store, store.new_token(), [other_offset, other_reader]) == \
        [DUPLICATE, DUPLICATE]
    assert value(redis_client, claim.key) == f"c|{first}|{claim.position}"
    entry = store.check(mid)
    assert entry is not None
    assert entry.id_state(now_ms()) is IdState.DONE


def test_other_position_live_is_busy_with_the_lease_left(store: DedupStore,
                                                         redis_client: redis.Redis) -> None:
    first, second = store.new_token(), store.new_token()
    mid = new_message_id()
    holder = claim_of(store, mid, 1)
    store.claim(first, [holder])
    held = value(redis_client, holder.key)
    [busy] = store.claim(second, [claim_of(store, mid, 2)])
    assert busy.result is BUSY
    assert LEASE_MS - 1_000 < busy.lease_ms <= LEASE_MS
    assert not busy.result.should_handle
    assert value(redis_client, holder.key) == held  # BUSY writes nothing
    assert record_of(redis_client, store, second, holder) == (None, -2)


def test_a_copy_twice_in_one_batch_is_busy_then_duplicate_once_done(
        one_shard: DedupStore) -> None:
    # Two copies of one message (a producer resend) in one poll: the second waits on the
    # first, its own batch; once that batch is done, the copy is a DUPLICATE.
    token = one_shard.new_token()
    mid = new_message_id()
    copies = [claim_of(one_shard, mid, 1), claim_of(one_shard, mid, 2)]
    outcomes = one_shard.claim(token, copies)
    assert [o.result for o in outcomes] == [NEW, BUSY]
    assert outcomes[1].lease_ms == LEASE_MS
    one_shard.done(token, copies[:1])
    assert claim_results(one_shard, one_shard.new_token(), copies[1:]) == [DUPLICATE]


def test_other_position_lapsed_is_taken_over(redis_client: redis.Redis, key_prefix: str) -> None:
    store = DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix),
                       lease_ms=150, grace_ms=GRACE_MS)
    first, second = store.new_token(), store.new_token()
    mid = new_message_id()
    stalled, fresh = claim_of(store, mid, 1), claim_of(store, mid, 2, ttl_ms=90_000)
    store.claim(first, [stalled])
    expire_at = redis_client.pexpiretime(stalled.key)
    assert claim_results(store, second, [fresh]) == [BUSY]
    time.sleep(0.3)  # the lease lapses on Redis's clock
    entry = store.check(mid)
    assert entry is not None
    assert entry.id_state(now_ms()) is IdState.FREE
    assert claim_results(store, second, [fresh]) == [NEW]
    assert value(redis_client, stalled.key) == f"c|{second}|{fresh.position}"
    assert redis_client.pexpiretime(stalled.key) == expire_at  # the key's TTL is kept
    assert record_of(redis_client, store, second, fresh)[1] == expire_at


def test_other_position_with_its_batch_record_missing_is_taken_over(
        store: DedupStore, redis_client: redis.Redis) -> None:
    first, second = store.new_token(), store.new_token()
    mid = new_message_id()
    holder = claim_of(store, mid, 1)
    store.claim(first, [holder])
    redis_client.delete(record_key(store, first, holder))  # a failover lost it, say
    entry = store.check(mid)
    assert entry is not None
    assert entry.batch is None
    assert entry.id_state(now_ms()) is IdState.FREE
    assert claim_results(store, second, [claim_of(store, mid, 2)]) == [NEW]
    assert value(redis_client, holder.key) == f"c|{second}|{claim_of(store, mid, 2).position}"


def test_expired_is_refused_and_nothing_is_written(store: DedupStore, redis_client: redis.Redis,
                                                   key_prefix: str) -> None:
    token = store.new_token()
    expired = claim_of(store, new_message_id(), 1, ttl_ms=-1)
    [outcome] = store.claim(token, [expired])
    assert outcome.result is EXPIRED
    assert not outcome.result.should_handle
    assert keys_under(redis_client, key_prefix) == set()  # no claim key, no batch record
    # A copy past its expiry is EXPIRED even when the id is held (not DUPLICATE or BUSY).
    held = claim_of(store, new_message_id(), 2)
    store.claim(token, [held])
    late = store.new_claim(held.message_id, position("g", "orders", 0, 3), now_ms() - 1)
    assert claim_results(store, store.new_token(), [late]) == [EXPIRED]
    assert value(redis_client, held.key) == f"c|{token}|{held.position}"


def test_a_claim_ttl_is_clamped_to_max_ttl_plus_grace(redis_client: redis.Redis,
                                                      key_prefix: str) -> None:
    max_ttl = 20_000
    store = DedupStore(redis_client, scope="billing",
                       keys=KeySpace(prefix=key_prefix, shards=1, max_ttl_ms=max_ttl),
                       lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    token = store.new_token()
    far = claim_of(store, new_message_id(), 1, ttl_ms=10 * 24 * 3_600_000)  # a bad record
    near = claim_of(store, new_message_id(), 2, ttl_ms=max_ttl - 5_000)
    before = now_ms()
    assert claim_results(store, token, [far, near]) == [NEW, NEW]
    after = now_ms()
    clamped = redis_client.pexpiretime(far.key)
    assert before + max_ttl + GRACE_MS <= clamped <= after + max_ttl + GRACE_MS
    assert redis_client.pexpiretime(near.key) == near.expires_at_ms + GRACE_MS  # within: as is
    assert record_of(redis_client, store, token, far)[1] == clamped


def test_nothing_is_claimed_under_a_done_token(one_shard: DedupStore,
                                               redis_client: redis.Redis) -> None:
    token, other = one_shard.new_token(), one_shard.new_token()
    mine, lapsed, live = (claim_of(one_shard, new_message_id(), i) for i in range(3))
    one_shard.claim(token, [mine])
    one_shard.done(token, [mine])
    one_shard.claim(other, [lapsed])
    gone_lapsed(one_shard, other, [lapsed])
    live_token = one_shard.new_token()
    one_shard.claim(live_token, [live])
    record = record_of(redis_client, one_shard, token, mine)
    absent = claim_of(one_shard, new_message_id(), 3)
    late = [absent, mine, claim_of(one_shard, mine.message_id, 9),
            claim_of(one_shard, lapsed.message_id, 10), claim_of(one_shard, live.message_id, 11)]
    assert claim_results(one_shard, token, late) == [STALE, DONE_HERE, DUPLICATE, STALE, BUSY]
    assert redis_client.exists(absent.key) == 0
    assert value(redis_client, lapsed.key) == f"c|{other}|{lapsed.position}"  # not taken over
    assert record_of(redis_client, one_shard, token, mine) == record  # nothing written


def test_the_batch_record_ttl_moves_to_the_latest_claim_later_only(
        one_shard: DedupStore, redis_client: redis.Redis) -> None:
    token = one_shard.new_token()
    first = claim_of(one_shard, new_message_id(), 1, ttl_ms=100_000)
    one_shard.claim(token, [first])
    opened, expire_at = record_of(redis_client, one_shard, token, first)
    assert expire_at == first.expires_at_ms + GRACE_MS
    time.sleep(0.01)
    earlier = claim_of(one_shard, new_message_id(), 2, ttl_ms=50_000)
    assert claim_results(one_shard, token, [earlier]) == [NEW]
    renewed, same = record_of(redis_client, one_shard, token, first)
    assert same == expire_at  # later only: an earlier claim does not shorten it
    assert deadline_of(renewed) > deadline_of(opened)  # a claim call renews the lease
    later = claim_of(one_shard, new_message_id(), 3, ttl_ms=200_000)
    one_shard.claim(token, [later])
    assert record_of(redis_client, one_shard, token, first)[1] == later.expires_at_ms + GRACE_MS
    # A claim re-owned from another batch brings its own TTL along.
    other = one_shard.new_token()
    longest = claim_of(one_shard, new_message_id(), 4, ttl_ms=300_000)
    one_shard.claim(other, [longest])
    assert claim_results(one_shard, token, [longest]) == [MINE]
    expire_at = record_of(redis_client, one_shard, token, first)[1]
    assert expire_at == longest.expires_at_ms + GRACE_MS
    # It outlives every claim naming the token, done included (done keeps the TTL).
    claims = [first, earlier, later, longest]
    assert all(redis_client.pexpiretime(c.key) <= expire_at for c in claims)
    assert done_results(one_shard, token, claims) == [DoneResult.OK] * 4
    done, kept = record_of(redis_client, one_shard, token, first)
    assert done is not None
    assert done.startswith("d|")
    assert kept == expire_at
