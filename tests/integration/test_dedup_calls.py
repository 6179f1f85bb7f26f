"""The dedup store (v2) against real Redis: renew, give back, release, what a batch costs
(script calls, keys written), inspection and scopes.

The tests that count commands (INFO commandstats) run on a Redis of their own: the shared one
serves other test runs at the same time, whose commands would land in the same counters.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.errors import ClaimNotOwnedError
from eoguard.store.dedup import (
    BatchState,
    DedupState,
    DedupStore,
    DoneResult,
    IdState,
    ReleaseResult,
    RenewResult,
    parse_position,
)
from eoguard.store.dedup_admin import scan_batches, scan_entries
from eoguard.store.keys import KeySpace
from tests.dedup_kit import (
    BUSY,
    DONE_HERE,
    DUPLICATE,
    GRACE_MS,
    LEASE_MS,
    MINE,
    NEW,
    calls_since,
    claim_of,
    claim_results,
    command_calls,
    deadline_of,
    done_results,
    record_of,
    value,
)

pytestmark = pytest.mark.integration


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
