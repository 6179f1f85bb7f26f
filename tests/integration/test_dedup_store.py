"""The dedup store against real Redis: every claim outcome, fencing, release, TTLs, effects."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.errors import ClaimNotOwnedError
from eoguard.store.dedup import (
    Claim,
    ClaimResult,
    DedupState,
    DedupStore,
    DoneResult,
    Effect,
    ReleaseResult,
    RenewResult,
    owner_token,
)
from eoguard.store.keys import KeySpace

pytestmark = pytest.mark.integration

GRACE_MS = 5_000


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    return DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix),
                      lease_ms=10_000, grace_ms=GRACE_MS)


def claim_of(message_id: str, offset: int, *, ttl_ms: int = 60_000) -> Claim:
    return Claim(message_id, owner_token("billing", "g", "orders", 0, offset), now_ms() + ttl_ms)


def test_new_then_mine_then_done_duplicate(store: DedupStore) -> None:
    mid = new_message_id()
    first = claim_of(mid, 7)
    assert store.claim([first])[0].result is ClaimResult.NEW
    # Redelivery of the very same record (same offset): re-owned, handled again.
    assert store.claim([first])[0].result is ClaimResult.MINE
    assert store.done([first])[0].result is DoneResult.OK
    # Once done: the same record (a redelivery) and a duplicate at another offset are both
    # skipped, told apart.
    assert store.claim([first])[0].result is ClaimResult.REDELIVERED
    assert store.claim([claim_of(mid, 99)])[0].result is ClaimResult.DONE
    entry = store.check(mid)
    assert entry is not None
    assert entry.state is DedupState.DONE
    assert entry.owner == first.owner


def test_busy_reports_remaining_lease(store: DedupStore) -> None:
    mid = new_message_id()
    store.claim([claim_of(mid, 1)])
    busy = store.claim([claim_of(mid, 2)])[0]
    assert busy.result is ClaimResult.BUSY
    assert 9_000 < busy.lease_ms <= 10_000
    # BUSY wrote nothing: the first owner still holds the claim.
    entry = store.check(mid)
    assert entry is not None
    assert entry.owner == claim_of(mid, 1).owner


def test_lapsed_lease_is_taken_over_and_old_owner_is_fenced(redis_client: redis.Redis,
                                                             key_prefix: str) -> None:
    store = DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix),
                       lease_ms=150, grace_ms=GRACE_MS)
    mid = new_message_id()
    zombie, fresh = claim_of(mid, 1), claim_of(mid, 2)
    assert store.claim([zombie])[0].result is ClaimResult.NEW
    time.sleep(0.3)
    assert store.claim([fresh])[0].result is ClaimResult.TAKEN_OVER
    counter = f"{key_prefix}:fx:counter"
    # The zombie finishes late: its done and its effect are both refused.
    zombie_done = store.done([zombie], {mid: [Effect("INCRBY", counter, (1,))]})[0]
    assert zombie_done.result is DoneResult.NOT_OWNED
    assert redis_client.get(counter) is None
    assert store.done([fresh], {mid: [Effect("INCRBY", counter, (1,))]})[0].result is DoneResult.OK
    assert store.done([fresh], {mid: [Effect("INCRBY", counter, (1,))]})[0].result \
        is DoneResult.ALREADY_DONE
    assert redis_client.get(counter) == b"1"


def test_expired_is_never_claimed(store: DedupStore, redis_client: redis.Redis) -> None:
    mid = new_message_id()
    outcome = store.claim([claim_of(mid, 1, ttl_ms=-1)])[0]
    assert outcome.result is ClaimResult.EXPIRED
    assert not outcome.result.should_handle
    assert redis_client.exists(store.key(mid)) == 0


def test_release_only_if_owned(store: DedupStore) -> None:
    mid = new_message_id()
    mine, other = claim_of(mid, 1), claim_of(mid, 2)
    store.claim([mine])
    assert store.release([other]) == [ReleaseResult.NOT_OWNED]
    with pytest.raises(ClaimNotOwnedError) as info:
        store.release([other], strict=True)
    assert info.value.message_id == mid
    assert info.value.owner == other.owner
    assert store.release([mine]) == [ReleaseResult.OK]
    assert store.check(mid) is None
    # Released: anyone claims it anew.
    assert store.claim([other])[0].result is ClaimResult.NEW
    store.done([other])
    assert store.release([other]) == [ReleaseResult.ALREADY_DONE]
    assert store.check(mid) is not None


def test_ttl_is_expires_at_plus_grace_through_every_transition(store: DedupStore,
                                                               redis_client: redis.Redis) -> None:
    mid = new_message_id()
    first = claim_of(mid, 1)
    want = first.expires_at_ms + GRACE_MS
    store.claim([first])
    assert redis_client.pexpiretime(store.key(mid)) == want
    store.claim([first])  # MINE keeps the TTL
    assert redis_client.pexpiretime(store.key(mid)) == want
    store.done([first])
    entry = store.check(mid)
    assert entry is not None
    assert entry.expire_at_ms == want


def test_batch_over_every_shard_is_one_round_trip(store: DedupStore) -> None:
    claims = [claim_of(new_message_id(), i) for i in range(300)]
    assert len({store.keys.shard_of(c.message_id) for c in claims}) == store.keys.shards
    before = store.round_trips
    outcomes = store.claim(claims)
    assert store.round_trips == before + 1
    assert [o.claim for o in outcomes] == claims
    assert all(o.result is ClaimResult.NEW for o in outcomes)
    done = store.done(claims[:150])
    assert store.round_trips == before + 2
    assert all(d.result is DoneResult.OK for d in done)
    again = store.claim(claims)
    assert [o.result for o in again] == [ClaimResult.REDELIVERED] * 150 + [ClaimResult.MINE] * 150
    others = store.claim([c._replace(owner=c.owner + "0") for c in claims])
    assert [o.result for o in others] == [ClaimResult.DONE] * 150 + [ClaimResult.BUSY] * 150


def test_effects_commit_with_done_and_nothing_on_wrong_type(store: DedupStore,
                                                            redis_client: redis.Redis,
                                                            key_prefix: str) -> None:
    good, bad = claim_of(new_message_id(), 1), claim_of(new_message_id(), 2)
    store.claim([good, bad])
    counter, seen, wrong = (f"{key_prefix}:fx:{n}" for n in ("counter", "seen", "wrong"))
    redis_client.set(wrong, "not a number")
    effects = {
        good.message_id: [Effect("INCRBY", counter, (5,)), Effect("SADD", seen, (good.message_id,))],
        bad.message_id: [Effect("SADD", seen, (bad.message_id,)), Effect("INCRBY", wrong, (1,))],
    }
    results = {d.claim.message_id: d for d in store.done([good, bad], effects)}
    assert results[good.message_id].result is DoneResult.OK
    assert results[bad.message_id].result is DoneResult.EFFECT_ERROR
    assert "not an integer" in results[bad.message_id].detail
    assert redis_client.get(counter) == b"5"
    # The bad message's first command was not applied either, and its claim is still held.
    assert redis_client.smembers(seen) == {good.message_id.encode()}
    entry = store.check(bad.message_id)
    assert entry is not None
    assert entry.state is DedupState.CLAIMED


def test_unknown_effect_command_is_refused(store: DedupStore, redis_client: redis.Redis,
                                           key_prefix: str) -> None:
    c = claim_of(new_message_id(), 1)
    store.claim([c])
    result = store.done([c], {c.message_id: [Effect("FLUSHALL", f"{key_prefix}:x")]})[0]
    assert result.result is DoneResult.EFFECT_ERROR
    assert "not allowed" in result.detail


def test_two_scopes_claim_independently(redis_client: redis.Redis, key_prefix: str) -> None:
    keys = KeySpace(prefix=key_prefix)
    a = DedupStore(redis_client, scope="a", keys=keys)
    b = DedupStore(redis_client, scope="b", keys=keys)
    mid = new_message_id()
    ca = Claim(mid, owner_token("a", "g", "t", 0, 0), now_ms() + 60_000)
    cb = Claim(mid, owner_token("b", "g", "t", 0, 0), now_ms() + 60_000)
    assert a.claim([ca])[0].result is ClaimResult.NEW
    a.done([ca])
    assert b.claim([cb])[0].result is ClaimResult.NEW
    assert a.claim([ca])[0].result is ClaimResult.REDELIVERED  # a read again: done by itself
    assert a.claim([ca._replace(owner=owner_token("a", "g", "t", 0, 1))])[0].result \
        is ClaimResult.DONE


def test_script_cache_flush_is_survived(private_redis) -> None:
    # A private Redis: flushing the shared one's script cache would disturb other tests.
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    c = claim_of(str(uuid.uuid4()), 1)
    assert store.claim([c])[0].result is ClaimResult.NEW
    client.script_flush()
    assert store.claim([c])[0].result is ClaimResult.MINE
    client.close()


def test_done_after_the_claim_vanished_is_absent_and_applies_nothing(
        store: DedupStore, redis_client: redis.Redis) -> None:
    mid = new_message_id()
    holder = claim_of(mid, 1)
    assert store.claim([holder])[0].result is ClaimResult.NEW
    redis_client.delete(store.key(mid))  # TTL ran out, `eoguard dedup forget`, or a failover
    assert store.done([holder])[0].result is DoneResult.ABSENT
    assert redis_client.exists(store.key(mid)) == 0
    assert store.claim([holder])[0].result is ClaimResult.NEW  # the consumer claims again
    assert store.done([holder])[0].result is DoneResult.OK


def test_done_by_a_non_owner_changes_nothing(store: DedupStore, redis_client: redis.Redis) -> None:
    mid = new_message_id()
    holder, other = claim_of(mid, 1), claim_of(mid, 2)
    assert store.done([other])[0].result is DoneResult.ABSENT  # and not created either
    assert store.check(mid) is None
    store.claim([holder])
    before = redis_client.get(store.key(mid))
    ttl_before = redis_client.pexpiretime(store.key(mid))
    assert store.done([other])[0].result is DoneResult.NOT_OWNED
    assert redis_client.get(store.key(mid)) == before
    assert redis_client.pexpiretime(store.key(mid)) == ttl_before
    store.done([holder])
    done_value = redis_client.get(store.key(mid))
    assert store.done([holder])[0].result is DoneResult.ALREADY_DONE
    assert store.done([other])[0].result is DoneResult.ALREADY_DONE
    assert redis_client.get(store.key(mid)) == done_value


def test_renew_extends_only_a_claim_already_ours(store: DedupStore,
                                                 redis_client: redis.Redis) -> None:
    absent, mine, other, done = (new_message_id() for _ in range(4))
    ours = [claim_of(absent, 1), claim_of(mine, 2), claim_of(other, 3), claim_of(done, 4)]
    store.claim([ours[1], claim_of(other, 30), ours[3]])  # other: held at another offset
    store.done([ours[3]])
    deadline = store.check(mine).at_ms  # type: ignore[union-attr]
    time.sleep(0.01)
    assert store.renew(ours) == [RenewResult.ABSENT, RenewResult.RENEWED,
                                 RenewResult.OTHER_OWNER, RenewResult.DONE]
    assert redis_client.exists(store.key(absent)) == 0  # never claimed by a renewal
    renewed = store.check(mine)
    assert renewed is not None
    assert renewed.state is DedupState.CLAIMED
    assert renewed.at_ms > deadline
    assert renewed.expire_at_ms == ours[1].expires_at_ms + GRACE_MS  # TTL kept
    held = store.check(other)
    assert held is not None
    assert held.owner == claim_of(other, 30).owner
    done_entry = store.check(done)
    assert done_entry is not None
    assert done_entry.state is DedupState.DONE
