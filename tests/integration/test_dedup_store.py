"""The dedup store (v2) against real Redis: every rule of docs/design.md §4's dedup section.

One test per rule where it reads well: claim outcomes (NEW, MINE, DONE_HERE, DUPLICATE, BUSY,
taken over, EXPIRED, STALE), TTLs (a claim's, clamped by ``max_ttl``; a batch record's, moved
to its latest claim), done (effects, let-go keys, fencing, ALREADY_DONE, a vanished record),
renew and give-back, release, and what a batch costs: script calls and keys written.

The tests that count commands (INFO commandstats) run on a Redis of their own: the shared one
serves other test runs at the same time, whose commands would land in the same counters.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.errors import ClaimNotOwnedError
from eoguard.stack.redis_server import RedisServer
from eoguard.store.dedup import (
    BatchState,
    Claim,
    ClaimResult,
    DedupState,
    DedupStore,
    DoneResult,
    Effect,
    IdState,
    ReleaseResult,
    RenewResult,
    parse_position,
    position,
)
from eoguard.store.dedup_admin import scan_batches, scan_entries
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import lua_script

pytestmark = pytest.mark.integration

GRACE_MS = 5_000
LEASE_MS = 10_000
NEW, MINE, DONE_HERE, DUPLICATE, BUSY, EXPIRED, PARTIAL, STALE = tuple(ClaimResult)


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    return DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix),
                      lease_ms=LEASE_MS, grace_ms=GRACE_MS)


@pytest.fixture
def one_shard(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    """A store whose claims all share one shard: one batch record per token."""
    return DedupStore(redis_client, scope="billing", keys=KeySpace(prefix=key_prefix, shards=1),
                      lease_ms=LEASE_MS, grace_ms=GRACE_MS)


@pytest.fixture
def own_redis(private_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of a Redis of this test alone, the dedup scripts loaded (a NOSCRIPT answer
    would count a second call)."""
    client = redis.Redis.from_url(private_redis.address)
    for name in ("dedup_claim", "dedup_done", "dedup_release", "dedup_renew"):
        client.script_load(lua_script(name).source)
    yield client
    client.close()


def claim_of(store: DedupStore, message_id: str, offset: int, *, ttl_ms: int = 60_000,
             reader: str = "g") -> Claim:
    return store.new_claim(message_id, position(reader, "orders", 0, offset), now_ms() + ttl_ms)


def claim_results(store: DedupStore, token: str, claims: Sequence[Claim]) -> list[ClaimResult]:
    return [outcome.result for outcome in store.claim(token, claims)]


def done_results(store: DedupStore, token: str, claims: Sequence[Claim],
                 **kwargs: Any) -> list[DoneResult]:
    return [outcome.result for outcome in store.done(token, claims, **kwargs)]


def value(client: redis.Redis, key: str) -> str | None:
    raw = client.get(key)
    return None if raw is None else raw.decode()


def record_key(store: DedupStore, token: str, claim: Claim) -> str:
    [(_, key)] = store.records(token, [claim])
    return key


def record_of(client: redis.Redis, store: DedupStore, token: str, claim: Claim
              ) -> tuple[str | None, int]:
    """The batch record covering ``claim`` under ``token``: its value and PEXPIRETIME."""
    key = record_key(store, token, claim)
    return value(client, key), int(client.pexpiretime(key))


def deadline_of(record: str | None) -> int:
    assert record is not None
    assert record.startswith("o|"), record
    return int(record[2:])


def keys_under(client: redis.Redis, prefix: str) -> set[str]:
    return {name.decode() for name in client.scan_iter(f"{prefix}:*", count=1000)}


def gone_lapsed(store: DedupStore, token: str, claims: Sequence[Claim]) -> None:
    """End the lease of ``token``'s batch now, as a consumer that stalled would see it lapse."""
    assert set(store.give_back(store.records(token, claims))) == {RenewResult.RENEWED}


# Claim ---------------------------------------------------------------------------------------
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


# Done ----------------------------------------------------------------------------------------
def test_done_applies_effects_of_handled_keys_and_deletes_the_let_go(
        one_shard: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    token = one_shard.new_token()
    a, b, c = (claim_of(one_shard, new_message_id(), i) for i in range(3))
    one_shard.claim(token, [a, b, c])
    counter, seen = f"{key_prefix}:fx:counter", f"{key_prefix}:fx:seen"
    effects = {a.message_id: [Effect("INCRBY", counter, (1,))],
               b.message_id: [Effect("INCRBY", counter, (10,))],  # let go: never applied
               c.message_id: [Effect("SADD", seen, (c.message_id,))]}
    before = now_ms()
    outcomes = done_results(one_shard, token, [a, b, c], handled=[True, False, True],
                            effects=effects)
    assert outcomes == [DoneResult.OK, DoneResult.RELEASED, DoneResult.OK]
    assert redis_client.get(counter) == b"1"
    assert redis_client.smembers(seen) == {c.message_id.encode()}
    assert redis_client.exists(b.key) == 0  # a retry claims it anew
    assert value(redis_client, a.key) == f"c|{token}|{a.position}"  # done by the record
    record = record_of(redis_client, one_shard, token, a)[0]
    assert record is not None
    assert record.startswith("d|")
    assert int(record[2:]) >= before - 1_000
    assert claim_results(one_shard, one_shard.new_token(), [b]) == [NEW]


def test_done_without_effects_touches_no_claim_key(store: DedupStore,
                                                   redis_client: redis.Redis) -> None:
    token = store.new_token()
    claims = [claim_of(store, new_message_id(), i) for i in range(20)]
    store.claim(token, claims)
    keys = [c.key for c in claims]
    before = [(redis_client.get(k), redis_client.pexpiretime(k)) for k in keys]
    assert done_results(store, token, claims) == [DoneResult.OK] * 20
    assert [(redis_client.get(k), redis_client.pexpiretime(k)) for k in keys] == before
    for _, key in store.records(token, claims):
        assert value(redis_client, key).startswith("d|")  # type: ignore[union-attr]


def test_the_first_done_of_a_record_read_twice_wins(store: DedupStore, redis_client: redis.Redis,
                                                    key_prefix: str) -> None:
    # The same reader claims the same record in two passes (a rebalance, a rewind): the
    # second is MINE and the key names it. The first pass's done, landing first, takes the key
    # back and applies its effects; the second pass's done then finds the record done.
    first, second = store.new_token(), store.new_token()
    claim = claim_of(store, new_message_id(), 1)
    store.claim(first, [claim])
    assert claim_results(store, second, [claim]) == [MINE]
    counter = f"{key_prefix}:fx:counter"
    effects = {claim.message_id: [Effect("INCRBY", counter, (1,))]}
    assert done_results(store, first, [claim], effects=effects) == [DoneResult.OK]
    assert redis_client.get(counter) == b"1"
    assert value(redis_client, claim.key) == f"c|{first}|{claim.position}"
    entry = store.check(claim.message_id)
    assert entry is not None
    assert entry.id_state(now_ms()) is IdState.DONE
    assert done_results(store, second, [claim], effects=effects) == [DoneResult.ALREADY_DONE]
    assert redis_client.get(counter) == b"1"


def test_a_pass_that_let_go_never_takes_back_a_reowned_key(store: DedupStore,
                                                         redis_client: redis.Redis) -> None:
    first, second = store.new_token(), store.new_token()
    claim = claim_of(store, new_message_id(), 1)
    store.claim(first, [claim])
    assert claim_results(store, second, [claim]) == [MINE]
    assert done_results(store, first, [claim], handled=[False]) == [DoneResult.NOT_OWNED]
    assert value(redis_client, claim.key) == f"c|{second}|{claim.position}"
    assert done_results(store, second, [claim]) == [DoneResult.OK]


def test_an_abandoned_re_claim_never_loses_the_record(store: DedupStore,
                                                      redis_client: redis.Redis) -> None:
    # The pass handling the record is re-claimed from under by a pass of the same reader that
    # is then abandoned (its partition lost, its connection timed out) and given back: the
    # handling pass's done still makes the record done.
    handling, abandoned = store.new_token(), store.new_token()
    claim = claim_of(store, new_message_id(), 1)
    store.claim(handling, [claim])
    assert claim_results(store, abandoned, [claim]) == [MINE]
    # The re-own is noted in the handling pass's re-owned hash, with the claim's expiry.
    noted = store.keys.dedup_reowned(store.scope, claim.shard, handling)
    assert redis_client.hgetall(noted) == {claim.key.encode(): claim.position.encode()}
    assert redis_client.pexpiretime(noted) == redis_client.pexpiretime(claim.key)
    store.give_back(store.records(abandoned, [claim]))
    assert done_results(store, handling, [claim]) == [DoneResult.OK]
    assert redis_client.exists(noted) == 0  # read and deleted by the done marks
    assert claim_results(store, store.new_token(), [claim_of(store, claim.message_id, 7)]) == \
        [DUPLICATE]


def test_a_done_batch_done_again_applies_nothing(one_shard: DedupStore,
                                                 redis_client: redis.Redis,
                                                 key_prefix: str) -> None:
    token = one_shard.new_token()
    a, b = claim_of(one_shard, new_message_id(), 1), claim_of(one_shard, new_message_id(), 2)
    one_shard.claim(token, [a, b])
    counter = f"{key_prefix}:fx:counter"
    effects = {a.message_id: [Effect("INCRBY", counter, (1,))],
               b.message_id: [Effect("INCRBY", counter, (1,))]}
    assert done_results(one_shard, token, [a, b], effects=effects) == [DoneResult.OK] * 2
    record = record_of(redis_client, one_shard, token, a)
    again = done_results(one_shard, token, [a, b], handled=[True, False], effects=effects)
    assert again == [DoneResult.ALREADY_DONE] * 2
    assert redis_client.get(counter) == b"2"
    assert redis_client.exists(a.key, b.key) == 2  # a let-go flag after done deletes nothing
    assert record_of(redis_client, one_shard, token, a) == record


def test_refused_effects_delete_the_claim_and_apply_nothing(
        one_shard: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    token = one_shard.new_token()
    good, bad = claim_of(one_shard, new_message_id(), 1), claim_of(one_shard, new_message_id(), 2)
    one_shard.claim(token, [good, bad])
    counter, seen, wrong = (f"{key_prefix}:fx:{n}" for n in ("counter", "seen", "wrong"))
    redis_client.set(wrong, "not a number")
    effects = {
        good.message_id: [Effect("INCRBY", counter, (5,)), Effect("SADD", seen, ("good",))],
        bad.message_id: [Effect("SADD", seen, ("bad",)), Effect("INCRBY", wrong, (1,))],
    }
    outcomes = {o.claim.message_id: o for o in one_shard.done(token, [good, bad], effects=effects)}
    assert outcomes[good.message_id].result is DoneResult.OK
    assert outcomes[bad.message_id].result is DoneResult.EFFECT_ERROR
    assert "not an integer" in outcomes[bad.message_id].detail
    assert redis_client.get(counter) == b"5"
    assert redis_client.smembers(seen) == {b"good"}  # the bad message's first command neither
    assert one_shard.check(bad.message_id) is None  # deleted: a retry claims anew
    assert claim_results(one_shard, one_shard.new_token(), [bad]) == [NEW]


def test_unknown_effect_command_is_refused(one_shard: DedupStore, key_prefix: str) -> None:
    token = one_shard.new_token()
    claim = claim_of(one_shard, new_message_id(), 1)
    one_shard.claim(token, [claim])
    [outcome] = one_shard.done(token, [claim],
                               effects={claim.message_id: [Effect("FLUSHALL", f"{key_prefix}:x")]})
    assert outcome.result is DoneResult.EFFECT_ERROR
    assert "not allowed" in outcome.detail


def test_done_after_the_claim_vanished_is_absent_and_applies_nothing(
        store: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    token = store.new_token()
    claim = claim_of(store, new_message_id(), 1)
    store.claim(token, [claim])
    assert store.forget(claim.message_id)  # `eoguard dedup forget`, a TTL, a failover
    counter = f"{key_prefix}:fx:counter"
    effects = {claim.message_id: [Effect("INCRBY", counter, (1,))]}
    assert done_results(store, token, [claim], effects=effects) == [DoneResult.ABSENT]
    assert redis_client.exists(claim.key, counter) == 0  # neither applied nor created
    retry = store.new_token()  # the consumer claims again under a new pass
    assert claim_results(store, retry, [claim]) == [NEW]
    assert done_results(store, retry, [claim], effects=effects) == [DoneResult.OK]
    assert redis_client.get(counter) == b"1"


def test_a_done_batch_whose_record_vanished_is_written_again_as_done(
        one_shard: DedupStore, redis_client: redis.Redis) -> None:
    token, other = one_shard.new_token(), one_shard.new_token()
    short, medium, long = (claim_of(one_shard, new_message_id(), i, ttl_ms=ttl)
                           for i, ttl in enumerate((60_000, 90_000, 120_000)))
    one_shard.claim(token, [short, medium, long])
    redis_client.delete(record_key(one_shard, token, short))  # a failover lost it, say
    # Meanwhile the longest claim is taken over (its record is missing: free).
    taken = claim_of(one_shard, long.message_id, 9)
    assert claim_results(one_shard, other, [taken]) == [NEW]
    # A simple done (all handled, no effects) reads no claim key: the taken-over claim is
    # the other pass's to settle, and the record is written again with the latest claim PXAT
    # of the pass (it outlives every claim that may still name the token).
    assert done_results(one_shard, token, [short, medium, long]) == [DoneResult.OK] * 3
    assert value(redis_client, long.key) == f"c|{other}|{taken.position}"
    record, expire_at = record_of(redis_client, one_shard, token, short)
    assert record is not None
    assert record.startswith("d|")
    assert expire_at == long.expires_at_ms + GRACE_MS
    assert claim_results(one_shard, one_shard.new_token(),
                         [claim_of(one_shard, short.message_id, 5)]) == [DUPLICATE]
    # All let go and the record gone: nothing is left to mark, nothing is written.
    lone = one_shard.new_token()
    let_go = claim_of(one_shard, new_message_id(), 1)
    one_shard.claim(lone, [let_go])
    redis_client.delete(record_key(one_shard, lone, let_go))
    assert done_results(one_shard, lone, [let_go], handled=[False]) == [DoneResult.RELEASED]
    assert record_of(redis_client, one_shard, lone, let_go) == (None, -2)


def test_a_done_mark_covers_every_claim_naming_the_token_listed_or_not(
        one_shard: DedupStore, redis_client: redis.Redis) -> None:
    # Why done must get EVERY claim the pass wrote: one it leaves out (not let go) is done too,
    # for every reader, though nothing handled it.
    token = one_shard.new_token()
    listed, left_out = claim_of(one_shard, new_message_id(), 1), claim_of(one_shard, new_message_id(), 2)
    one_shard.claim(token, [listed, left_out])
    assert done_results(one_shard, token, [listed]) == [DoneResult.OK]
    assert claim_results(one_shard, one_shard.new_token(),
                         [left_out, claim_of(one_shard, left_out.message_id, 3)]) == \
        [DONE_HERE, DUPLICATE]
    assert value(redis_client, left_out.key) == f"c|{token}|{left_out.position}"


# Fencing -------------------------------------------------------------------------------------
def test_a_zombie_done_landing_before_the_takeover_wins(
        store: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    zombie = store.new_token()
    mid = new_message_id()
    claim = claim_of(store, mid, 1)
    store.claim(zombie, [claim])
    gone_lapsed(store, zombie, [claim])  # stalled past its lease, nobody took it yet
    counter = f"{key_prefix}:fx:counter"
    effects = {mid: [Effect("INCRBY", counter, (1,))]}
    assert done_results(store, zombie, [claim], effects=effects) == [DoneResult.OK]
    # Done now: its reader finds it DONE_HERE, any other position a DUPLICATE.
    assert claim_results(store, store.new_token(), [claim, claim_of(store, mid, 2)]) == \
        [DONE_HERE, DUPLICATE]
    assert redis_client.get(counter) == b"1"


@pytest.mark.parametrize("how", ["taken-over-elsewhere", "re-owned-here"])
def test_a_zombie_done_landing_after_a_reown_is_fenced(
        how: str, store: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    zombie, fresh = store.new_token(), store.new_token()
    mid = new_message_id()
    claim = claim_of(store, mid, 1)
    store.claim(zombie, [claim])
    if how == "taken-over-elsewhere":
        gone_lapsed(store, zombie, [claim])
        again = claim_of(store, mid, 2)
        assert claim_results(store, fresh, [again]) == [NEW]
    else:  # the record read again at the same position (a rebalance): re-owned, lease live
        again = claim
        assert claim_results(store, fresh, [again]) == [MINE]
    counter = f"{key_prefix}:fx:counter"
    effects = {mid: [Effect("INCRBY", counter, (1,))]}
    if how == "taken-over-elsewhere":
        assert done_results(store, zombie, [claim], effects=effects) == [DoneResult.NOT_OWNED]
        assert redis_client.get(counter) is None
        # The zombie's done mark does not make the key done: the fresh batch still holds it.
        assert claim_results(store, store.new_token(), [claim_of(store, mid, 3)]) == [BUSY]
        assert done_results(store, fresh, [again], effects=effects) == [DoneResult.OK]
        assert done_results(store, zombie, [claim], effects=effects) == [DoneResult.NOT_OWNED]
        assert done_results(store, fresh, [again], effects=effects) == [DoneResult.ALREADY_DONE]
    else:  # same position: whichever done lands first applies, the other finds it done
        assert done_results(store, fresh, [again], effects=effects) == [DoneResult.OK]
        assert done_results(store, zombie, [claim], effects=effects) == [DoneResult.ALREADY_DONE]
    assert redis_client.get(counter) == b"1"


# Renew, give back, release --------------------------------------------------------------------
def test_renew_moves_only_open_records(store: DedupStore, redis_client: redis.Redis) -> None:
    open_token, done_token, absent_token = (store.new_token() for _ in range(3))
    a, b = claim_of(store, new_message_id(), 1), claim_of(store, new_message_id(), 2)
    store.claim(open_token, [a])
    store.claim(done_token, [b])
    store.done(done_token, [b])
    open_before = record_of(redis_client, store, open_token, a)
    done_before = record_of(redis_client, store, done_token, b)
    records = [*store.records(open_token, [a]), *store.records(done_token, [b]),
               *store.records(absent_token, [a])]
    before = now_ms()
    assert store.renew(records, 60_000) == [RenewResult.RENEWED, RenewResult.DONE,
                                            RenewResult.ABSENT]
    record, expire_at = record_of(redis_client, store, open_token, a)
    assert before + 60_000 <= deadline_of(record) <= now_ms() + 60_000
    assert expire_at == open_before[1]  # TTL kept
    assert record_of(redis_client, store, done_token, b) == done_before
    assert record_of(redis_client, store, absent_token, a) == (None, -2)  # never created
    assert redis_client.get(a.key) == f"c|{open_token}|{a.position}".encode()  # claims untouched


def test_giving_a_batch_back_frees_its_open_claims_at_once(
        store: DedupStore, redis_client: redis.Redis) -> None:
    given, done = store.new_token(), store.new_token()
    a, b, c = (claim_of(store, new_message_id(), i) for i in range(3))
    store.claim(given, [a, b])
    store.claim(done, [c])
    store.done(done, [c])
    done_record = record_of(redis_client, store, done, c)
    records = store.records(given, [a, b]) + store.records(done, [c])
    assert store.give_back(records) == [RenewResult.RENEWED] * (len(records) - 1) + \
        [RenewResult.DONE]
    for claim in (a, b):
        entry = store.check(claim.message_id)
        assert entry is not None
        assert entry.id_state(now_ms()) is IdState.FREE
    other = claim_of(store, a.message_id, 10)
    assert claim_results(store, store.new_token(), [other, b, claim_of(store, c.message_id, 11)]) \
        == [NEW, MINE, DUPLICATE]
    assert record_of(redis_client, store, done, c) == done_record  # a done batch stays done


def test_release_deletes_only_keys_naming_the_token(store: DedupStore,
                                                   redis_client: redis.Redis) -> None:
    token, other = store.new_token(), store.new_token()
    mine, kept = claim_of(store, new_message_id(), 1), claim_of(store, new_message_id(), 2)
    theirs, absent = claim_of(store, new_message_id(), 3), claim_of(store, new_message_id(), 4)
    store.claim(token, [mine, kept])
    store.claim(other, [theirs])
    theirs_value = value(redis_client, theirs.key)
    assert store.release(token, [mine, theirs, absent]) == \
        [ReleaseResult.OK, ReleaseResult.NOT_OWNED, ReleaseResult.NOT_OWNED]
    assert redis_client.exists(mine.key, absent.key) == 0
    assert value(redis_client, theirs.key) == theirs_value
    assert value(redis_client, kept.key) == f"c|{token}|{kept.position}"  # the batch goes on
    assert record_of(redis_client, store, token, kept)[0].startswith("o|")  # type: ignore[union-attr]
    with pytest.raises(ClaimNotOwnedError) as info:
        store.release(token, [theirs], strict=True)
    assert info.value.message_id == theirs.message_id
    assert info.value.owner == token
    # Released: claimed anew by anyone.
    assert claim_results(store, store.new_token(), [claim_of(store, mine.message_id, 9)]) == [NEW]
    # Once the batch is done its keys stay: they keep catching duplicates.
    store.done(token, [kept])
    assert store.release(token, [kept]) == [ReleaseResult.ALREADY_DONE]
    assert redis_client.exists(kept.key) == 1


# Several shards, script calls, keys written ---------------------------------------------------
def test_a_batch_over_every_shard_is_one_call_and_one_round_trip(store: DedupStore) -> None:
    first, second, third = (store.new_token() for _ in range(3))
    claims = [claim_of(store, new_message_id(), i) for i in range(300)]
    assert len({c.shard for c in claims}) == store.keys.shards
    assert len(store.prepare_claim(first, claims).calls) == 1
    assert len(store.prepare_done(first, claims).calls) == 1
    before = store.round_trips
    outcomes = store.claim(first, claims)
    assert store.round_trips == before + 1
    assert [o.claim for o in outcomes] == claims
    assert all(o.result is NEW for o in outcomes)
    handled = [i < 150 for i in range(300)]
    assert done_results(store, first, claims, handled=handled) == \
        [DoneResult.OK] * 150 + [DoneResult.RELEASED] * 150
    assert store.round_trips == before + 2
    assert claim_results(store, second, claims) == [DONE_HERE] * 150 + [NEW] * 150
    elsewhere = [claim_of(store, c.message_id, 1_000 + i) for i, c in enumerate(claims)]
    assert claim_results(store, third, elsewhere) == [DUPLICATE] * 150 + [BUSY] * 150


def command_calls(client: redis.Redis) -> dict[str, int]:
    """INFO commandstats: calls per command (commands run inside scripts count too)."""
    return {name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in client.info("commandstats").items()}


def calls_since(client: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = command_calls(client)
    return {name: n - before.get(name, 0) for name, n in after.items()
            if n != before.get(name, 0) and name not in ("info", "command|info")}


def writes_of(client: redis.Redis, calls: dict[str, int]) -> dict[str, int]:
    """The calls of commands Redis flags as writes (each writes one key here)."""
    names = [name for name in calls if "|" not in name]
    info = client.execute_command("COMMAND", "INFO", *names) if names else {}
    return {name: calls[name] for name in names if "write" in info[name]["flags"]}


def test_one_script_call_per_batch_on_a_single_node(own_redis: redis.Redis) -> None:
    store = DedupStore(own_redis, scope="s", lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    token = store.new_token()
    claims = [claim_of(store, new_message_id(), i) for i in range(300)]
    assert len({c.shard for c in claims}) == 16
    seen: dict[str, int] = {}
    for what, run in (("claim", lambda: store.claim(token, claims)),
                      ("renew", lambda: store.renew(store.records(token, claims))),
                      ("release", lambda: store.release(token, claims[:10])),
                      ("done", lambda: store.done(token, claims[10:]))):
        before = command_calls(own_redis)
        run()
        seen[what] = calls_since(own_redis, before).get("evalsha", 0)
    print(f"EVALSHA calls for a batch of 300 claims on 16 shards: {seen}")
    assert seen == {"claim": 1, "renew": 1, "release": 1, "done": 1}


def test_per_shard_calls_give_the_same_answers(own_redis: redis.Redis) -> None:
    # The Redis Cluster path (one call per shard) run on a single node: same results, in order.
    single = DedupStore(own_redis, scope="s", lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    sharded = DedupStore(own_redis, scope="s", lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    sharded._shards.one_call = False  # as on a RedisCluster client
    first, second = single.new_token(), sharded.new_token()
    claims = [claim_of(single, new_message_id(), i) for i in range(200)]
    assert len(sharded.prepare_claim(first, claims).calls) == 16
    assert claim_results(sharded, first, claims) == [NEW] * 200
    handled = [i % 3 != 0 for i in range(200)]
    before = command_calls(own_redis)
    outcomes = done_results(sharded, first, claims, handled=handled)
    assert calls_since(own_redis, before)["evalsha"] == 16
    assert outcomes == [DoneResult.OK if h else DoneResult.RELEASED for h in handled]
    expected = [DONE_HERE if h else NEW for h in handled]
    assert claim_results(single, second, claims) == expected
    # Only shards where the second pass wrote (a NEW claim) have a record of its token.
    written = {claim.shard for claim, h in zip(claims, handled, strict=True) if not h}
    assert sharded.renew(sharded.records(second, claims)) == [
        RenewResult.RENEWED if shard in written else RenewResult.ABSENT
        for shard, _ in sharded.records(second, claims)]
    assert sharded.release(second, claims) == \
        [ReleaseResult.NOT_OWNED if h else ReleaseResult.OK for h in handled]


def test_keys_written_per_message(own_redis: redis.Redis) -> None:
    """Claim then done, all handled, no effects: one key per message plus one record per
    batch and shard, written twice (open, then done)."""
    store = DedupStore(own_redis, scope="s", lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    messages, size = 10_000, 500
    before = command_calls(own_redis)
    for start in range(0, messages, size):
        token = store.new_token()
        claims = [claim_of(store, new_message_id(), start + i) for i in range(size)]
        report = store.prepare_claim(token, claims)
        [claimed] = store.run([report])
        assert claimed.results.count(NEW) == size
        [done] = store.run([store.prepare_done(token, claims)])
        assert done.results.count(DoneResult.OK) == size
    calls = calls_since(own_redis, before)
    writes = writes_of(own_redis, calls)
    per_message = sum(writes.values()) / messages
    print(f"keys written per message: {per_message:.4f} ({sum(writes.values())} writes for "
          f"{messages} messages in batches of {size} on 16 shards: {writes}; "
          f"all commands: {calls})")
    assert per_message <= 1.1
    assert own_redis.dbsize() == messages + messages // size * 16


# Inspection, scopes, script cache -------------------------------------------------------------
def test_check_and_scans_show_each_id_state(store: DedupStore, redis_client: redis.Redis,
                                            key_prefix: str) -> None:
    open_token, done_token = store.new_token(), store.new_token()
    held, settled = claim_of(store, new_message_id(), 1), claim_of(store, new_message_id(), 2)
    store.claim(open_token, [held])
    store.claim(done_token, [settled])
    store.done(done_token, [settled])
    assert store.check(new_message_id()) is None
    entry = store.check(held.message_id)
    assert entry is not None
    assert entry.state is DedupState.CLAIMED
    assert entry.scope == "billing"
    assert parse_position(entry.position).offset == 1
    assert entry.batch is not None
    assert entry.batch.state is BatchState.OPEN
    assert entry.id_state(now_ms()) is IdState.IN_PROGRESS
    assert entry.id_state(entry.batch.at_ms + 1) is IdState.FREE
    entries = {e.message_id: e for page in scan_entries(redis_client, store.keys, scope="billing")
               for e in page}
    assert set(entries) == {held.message_id, settled.message_id}
    assert entries[settled.message_id].id_state(now_ms()) is IdState.DONE
    batches = {b.token: b.state for page in scan_batches(redis_client, store.keys) for b in page}
    assert batches == {open_token: BatchState.OPEN, done_token: BatchState.DONE}
    assert key_prefix in entry.key


def test_two_scopes_claim_independently(redis_client: redis.Redis, key_prefix: str) -> None:
    keys = KeySpace(prefix=key_prefix)
    a = DedupStore(redis_client, scope="a", keys=keys)
    b = DedupStore(redis_client, scope="b", keys=keys)
    mid, token = new_message_id(), a.new_token()
    ca, cb = claim_of(a, mid, 0), claim_of(b, mid, 0)
    assert claim_results(a, token, [ca]) == [NEW]
    a.done(token, [ca])
    assert claim_results(b, token, [cb]) == [NEW]  # one token, another scope: its own records
    assert claim_results(a, a.new_token(), [ca, claim_of(a, mid, 1)]) == [DONE_HERE, DUPLICATE]


def test_script_cache_flush_is_survived(own_redis: redis.Redis) -> None:
    store = DedupStore(own_redis, scope="s")
    token = store.new_token()
    claim = claim_of(store, str(uuid.uuid4()), 1)
    assert claim_results(store, token, [claim]) == [NEW]
    own_redis.script_flush()
    assert claim_results(store, store.new_token(), [claim]) == [MINE]
