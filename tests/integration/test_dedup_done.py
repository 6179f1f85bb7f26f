"""The dedup store (v2) against real Redis: the done rules of docs/design.md §4 and fencing.

Done marks apply the effects of handled claims still naming their token, delete the let-go
ones, take back claims re-owned at the same position by a pass not done (the first done of a
record wins), find a done batch ALREADY_DONE, refuse bad effects, and write a lost record
again; a zombie's done marks are fenced per key.
"""

from __future__ import annotations

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.dedup import (
    DedupStore,
    DoneResult,
    Effect,
    IdState,
)
from tests.dedup_kit import (
    BUSY,
    DONE_HERE,
    DUPLICATE,
    GRACE_MS,
    MINE,
    NEW,
    claim_of,
    claim_results,
    done_results,
    gone_lapsed,
    record_key,
    record_of,
    value,
)

pytestmark = pytest.mark.integration


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


@pytest.mark.cluster
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
