"""Transactional effects against real Redis: dedup_done.lua applies a message's commands all or
not at all (EFFECT_ERROR: nothing applied, the claim deleted so a retry claims anew), and when
Redis fails one midway anyway it reports PARTIAL and marks the key "p" (done for every reader),
so nothing is ever applied twice."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.dedup import (
    Claim,
    ClaimResult,
    DedupState,
    DedupStore,
    DoneOutcome,
    DoneResult,
    Effect,
    IdState,
    ReleaseResult,
    position,
)
from eoguard.store.keys import KeySpace

pytestmark = pytest.mark.integration

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    # One shard: every message of a test is in one hash slot, so one dedup_done call.
    return DedupStore(redis_client, scope="fx", keys=KeySpace(prefix=key_prefix, shards=1),
                      lease_ms=10_000, grace_ms=5_000)


@pytest.fixture
def k(key_prefix: str) -> dict[str, str]:
    """Effect key names by role, all under this test's prefix."""
    return {name: f"{key_prefix}:fx:{name}" for name in ("a", "b", "marker")}


class Held(NamedTuple):
    """A claim and the token of the pass that holds it."""

    token: str
    claim: Claim


def claim_at(store: DedupStore, message_id: str, offset: int) -> Claim:
    return store.new_claim(message_id, position("g", "t", 0, offset), now_ms() + 60_000)


def claimed(store: DedupStore, offset: int = 1) -> Held:
    """A new message claimed by a claim pass of its own."""
    held = Held(store.new_token(), claim_at(store, new_message_id(), offset))
    assert store.claim(held.token, [held.claim])[0].result is ClaimResult.NEW
    return held


def done_one(store: DedupStore, held: Held, effects: Sequence[Effect]) -> DoneOutcome:
    return store.done(held.token, [held.claim], effects={held.claim.message_id: effects})[0]


def state_of(store: DedupStore, held: Held) -> IdState:
    entry = store.check(held.claim.message_id)
    return IdState.NEW if entry is None else entry.id_state(now_ms())


def dump(client: redis.Redis, *keys: str) -> list[bytes | None]:
    return [client.dump(key) for key in keys]


# Sequences whose commands conflict with each other (or with the data) only after an earlier
# command of the same message: the old check passed them and then failed midway.
CONFLICTS: dict[str, tuple[list[tuple[str, str, tuple[str | int, ...]]], str]] = {
    "set-then-incrby": ([("SET", "a", ("x",)), ("INCRBY", "a", (1,))], "not an integer"),
    "hset-then-incrby": ([("HSET", "a", ("f", "v")), ("INCRBY", "a", (1,))], "holds a hash"),
    "sadd-then-rpush": ([("SADD", "a", ("m",)), ("RPUSH", "a", ("v",))], "holds a set"),
    "hset-then-hincrby": ([("HSET", "a", ("f", "x")), ("HINCRBY", "a", ("f", 1))],
                          "hash value is not an integer"),
    "set-then-zadd": ([("SET", "a", (1,)), ("ZADD", "a", (1, "m"))], "holds a string"),
    "del-then-set-then-hdel": ([("DEL", "a", ()), ("SET", "a", (1,)), ("HDEL", "a", ("f",))],
                               "holds a string"),
    "incrby-overflow": ([("SET", "a", (I64_MAX - 5,)), ("INCRBY", "a", (6,))], "overflow"),
    "decrby-overflow": ([("SET", "a", (I64_MIN + 5,)), ("DECRBY", "a", (6,))], "overflow"),
    "decrby-min": ([("INCRBY", "a", (1,)), ("DECRBY", "a", (I64_MIN,))], "overflow"),
    "hincrby-overflow": ([("HINCRBY", "a", ("f", I64_MAX)), ("HINCRBY", "a", ("f", 1))],
                         "overflow"),
    "incrby-not-int-arg": ([("INCRBY", "a", ("1.5",))], "not an integer"),
    "leading-zero-value": ([("SET", "a", ("007",)), ("INCRBY", "a", (1,))], "not an integer"),
    "set-bad-px": ([("SET", "a", ("v", "PX", 0))], "invalid expire time"),
    "set-get-option": ([("SET", "a", ("v", "GET"))], "not supported"),
    "zadd-nan": ([("ZADD", "a", ("nan", "m"))], "not a valid float"),
    "zadd-option": ([("ZADD", "a", ("XX", "CH", "1", "m"))], "not a valid float"),
    "expire-not-int": ([("SET", "a", ("v",)), ("EXPIRE", "a", ("soon",))], "invalid expire"),
    "hset-odd-args": ([("HSET", "a", ("f",))], "wrong number of arguments"),
    "del-two-keys": ([("DEL", "a", ("other",))], "wrong number of arguments"),
    "pexpireat-now-then-sadd": ([("SET", "a", ("v",)), ("PEXPIREAT", "a", ("NOW",)),
                                 ("SADD", "a", ("m",))], "may have just expired"),
    "emptied-hash-then-set-nx": ([("HSET", "a", ("f", "v")), ("HDEL", "a", ("f",)),
                                  ("SET", "a", ("v", "NX")), ("HSET", "a", ("g", "w"))],
                                 "undecidable"),
    "unknown-command": ([("APPEND", "a", ("x",))], "not allowed"),
}


def build(spec: list[tuple[str, str, tuple[str | int, ...]]], k: dict[str, str]) -> list[Effect]:
    now = str(now_ms())
    return [Effect(cmd, k[key], tuple(now if a == "NOW" else a for a in args))
            for cmd, key, args in spec]


@pytest.mark.parametrize("name", sorted(CONFLICTS))
def test_conflicting_commands_are_refused_with_nothing_applied(
        name: str, store: DedupStore, redis_client: redis.Redis, k: dict[str, str]) -> None:
    spec, reason = CONFLICTS[name]
    held = claimed(store)
    redis_client.set(k["b"], "untouched")
    # A valid first command on another key: it must not be applied either.
    effects = [Effect("SADD", k["marker"], ("seen",)), *build(spec, k)]
    before = dump(redis_client, k["a"], k["b"])
    outcome = done_one(store, held, effects)
    assert outcome.result is DoneResult.EFFECT_ERROR, outcome
    assert reason in outcome.detail
    assert outcome.detail.endswith("nothing applied")
    assert redis_client.exists(k["marker"]) == 0
    assert dump(redis_client, k["a"], k["b"]) == before
    assert state_of(store, held) is IdState.NEW  # the claim deleted: a retry claims anew


def test_conflict_with_existing_data_is_refused_too(store: DedupStore, redis_client: redis.Redis,
                                                   k: dict[str, str]) -> None:
    redis_client.set(k["a"], str(I64_MAX - 1))
    held = claimed(store)
    outcome = done_one(store, held, [Effect("SADD", k["marker"], ("m",)),
                                     Effect("INCRBY", k["a"], (2,))])
    assert outcome.result is DoneResult.EFFECT_ERROR
    assert "overflow" in outcome.detail
    assert redis_client.exists(k["marker"]) == 0
    assert redis_client.get(k["a"]) == str(I64_MAX - 1).encode()


@pytest.mark.parametrize("target", ["own-claim", "other-claim", "other-scope-record"])
def test_effect_on_a_dedup_key_is_refused(target: str, store: DedupStore,
                                          redis_client: redis.Redis, key_prefix: str) -> None:
    # Not only the keys of the call: deleting another message's claim would let a copy of it
    # be handled again.
    held, other = claimed(store), claimed(store, 2)
    elsewhere = DedupStore(redis_client, scope="other", keys=store.keys)
    key = {"own-claim": held.claim.key, "other-claim": other.claim.key,
           "other-scope-record": elsewhere.keys.dedup_batch("other", 0, "tok")}[target]
    if target == "other-scope-record":
        redis_client.set(key, "o|1", px=60_000)
    outcome = done_one(store, held, [Effect("SADD", f"{key_prefix}:fx:marker", ("m",)),
                                     Effect("DEL", key)])
    assert outcome.result is DoneResult.EFFECT_ERROR
    assert "dedup key" in outcome.detail
    assert state_of(store, held) is IdState.NEW
    assert redis_client.exists(key) == (0 if target == "own-claim" else 1)  # refused: deleted
    assert redis_client.exists(f"{key_prefix}:fx:marker") == 0
    # An effect key merely holding "dc:" or "db:" further on is an effect key like any other.
    again = claimed(store, 3)
    name = store.effect_key(again.claim.message_id, "dc:db:x")
    assert done_one(store, again, [Effect("SET", name, ("v",))]).result is DoneResult.OK


@pytest.mark.parametrize("command", [("DEL", ()), ("SET", ("o|1",)), ("PEXPIRE", (1,))])
def test_effect_on_a_batch_record_is_refused(
        command: tuple[str, tuple[str | int, ...]], store: DedupStore,
        redis_client: redis.Redis) -> None:
    # Its own batch record: deleted, the done mark would be written again without a TTL.
    held = claimed(store)
    [(_, record)] = store.records(held.token, [held.claim])
    name, args = command
    outcome = done_one(store, held, [Effect(name, record, args)])
    assert outcome.result is DoneResult.EFFECT_ERROR, outcome
    assert "dedup key" in outcome.detail
    assert redis_client.get(record).startswith(b"d|")  # type: ignore[union-attr]
    assert redis_client.pexpiretime(record) == held.claim.expires_at_ms + 5_000


def test_too_many_arguments_are_refused_not_a_script_error(
        store: DedupStore, redis_client: redis.Redis, k: dict[str, str]) -> None:
    held = claimed(store)
    members = [str(i) for i in range(7001)]
    outcome = done_one(store, held, [Effect("SADD", k["marker"], ("m",)),
                                     Effect("SADD", k["a"], tuple(members))])
    assert outcome.result is DoneResult.EFFECT_ERROR
    assert "split it" in outcome.detail
    assert redis_client.exists(k["marker"]) == 0
    retry = Held(store.new_token(), held.claim)
    assert store.claim(retry.token, [retry.claim])[0].result is ClaimResult.NEW
    assert done_one(store, retry, [Effect("SADD", k["a"], tuple(members[:7000]))]).result \
        is DoneResult.OK
    assert redis_client.scard(k["a"]) == 7000


def test_sequences_that_read_their_own_writes_are_accepted(
        store: DedupStore, redis_client: redis.Redis, k: dict[str, str], key_prefix: str) -> None:
    c, d, e, f = (f"{key_prefix}:fx:{n}" for n in "cdef")
    redis_client.set(k["b"], "text")
    redis_client.set(d, "a string")
    redis_client.set(f, "v")
    held = claimed(store)
    effects = [
        Effect("SET", k["a"], (5,)), Effect("INCRBY", k["a"], (2,)),          # 7
        Effect("DEL", k["b"]), Effect("HINCRBY", k["b"], ("n", 3)),          # hash n=3
        Effect("HSET", c, ("f", "x")), Effect("HSET", c, ("f", 4)), Effect("HINCRBY", c, ("f", 1)),
        Effect("PEXPIRE", d, (0,)), Effect("SADD", d, ("m",)),               # deleted, then a set
        Effect("SET", e, (I64_MAX - 7,)), Effect("INCRBY", e, (7,)), Effect("DECRBY", e, (1,)),
        Effect("PEXPIREAT", f, (now_ms() - 60_000,)), Effect("RPUSH", f, ("x",)),  # past: gone
        Effect("EXPIRE", k["marker"], (10,)), Effect("INCRBY", k["marker"], (1,)),  # no-op, then 1
    ]
    outcome = done_one(store, held, effects)
    assert outcome.result is DoneResult.OK, outcome.detail
    assert redis_client.get(k["a"]) == b"7"
    assert redis_client.hgetall(k["b"]) == {b"n": b"3"}
    assert redis_client.hget(c, "f") == b"5"
    assert redis_client.smembers(d) == {b"m"}
    assert redis_client.get(e) == str(I64_MAX - 1).encode()
    assert redis_client.lrange(f, 0, -1) == [b"x"]
    assert redis_client.get(k["marker"]) == b"1"
    assert state_of(store, held) is IdState.DONE


def test_retry_after_a_refusal_applies_exactly_once(store: DedupStore, redis_client: redis.Redis,
                                                    k: dict[str, str]) -> None:
    held = claimed(store)
    bad = [Effect("INCRBY", k["a"], (10,)), Effect("SET", k["b"], ("x",)),
           Effect("INCRBY", k["b"], (1,))]
    assert done_one(store, held, bad).result is DoneResult.EFFECT_ERROR
    assert redis_client.exists(k["a"], k["b"]) == 0
    # The consumer claims again under a new pass (the claim was deleted), valid this time.
    retry = Held(store.new_token(), held.claim)
    assert store.claim(retry.token, [retry.claim])[0].result is ClaimResult.NEW
    good = [Effect("INCRBY", k["a"], (10,)), Effect("SET", k["b"], ("x",))]
    assert done_one(store, retry, good).result is DoneResult.OK
    assert done_one(store, retry, good).result is DoneResult.ALREADY_DONE
    # The first pass, late: its claim was deleted and claimed anew at the same position by a
    # pass that is done: done first elsewhere, nothing applied.
    assert done_one(store, held, good).result is DoneResult.ALREADY_DONE
    assert redis_client.get(k["a"]) == b"10"
    assert redis_client.get(k["b"]) == b"x"


def test_each_message_of_one_call_sees_the_earlier_messages_writes(
        store: DedupStore, redis_client: redis.Redis, k: dict[str, str]) -> None:
    # Messages of one call are checked one by one right before each is applied.
    token = store.new_token()
    claims = [claim_at(store, new_message_id(), offset) for offset in range(1, 5)]
    assert [o.result for o in store.claim(token, claims)] == [ClaimResult.NEW] * 4
    first, second, third, fourth = claims
    effects = {
        first.message_id: [Effect("SET", k["a"], ("x",))],
        second.message_id: [Effect("SADD", k["marker"], ("2",)), Effect("INCRBY", k["a"], (1,))],
        third.message_id: [Effect("SET", k["b"], (5,))],
        fourth.message_id: [Effect("INCRBY", k["b"], (2,))],
    }
    outcomes = store.done(token, claims, effects=effects)
    assert [o.result for o in outcomes] == [DoneResult.OK, DoneResult.EFFECT_ERROR,
                                            DoneResult.OK, DoneResult.OK]
    assert "not an integer" in outcomes[1].detail
    assert redis_client.get(k["a"]) == b"x"
    assert redis_client.exists(k["marker"]) == 0
    assert redis_client.get(k["b"]) == b"7"
    assert state_of(store, Held(token, second)) is IdState.NEW
    assert state_of(store, Held(token, first)) is IdState.DONE


def test_a_midway_failure_is_partial_marked_done_and_never_reapplied(
        limited_client: redis.Redis, redis_client: redis.Redis, key_prefix: str,
        k: dict[str, str]) -> None:
    store = DedupStore(limited_client, scope="fx", keys=KeySpace(prefix=key_prefix, shards=1))
    held = claimed(store)
    claim = held.claim
    effects = [Effect("INCRBY", k["a"], (1,)), Effect("SADD", k["b"], ("m",))]
    outcome = done_one(store, held, effects)
    assert outcome.result is DoneResult.PARTIAL
    assert "can't run this command" in outcome.detail
    assert "1 before it stay applied" in outcome.detail
    assert redis_client.get(k["a"]) == b"1"
    assert redis_client.get(claim.key) == f"p|{held.token}|{claim.position}".encode()
    assert redis_client.pexpiretime(claim.key) == claim.expires_at_ms + store.grace_ms
    entry = store.check(claim.message_id)
    assert entry is not None
    assert entry.state is DedupState.PARTIAL
    assert state_of(store, held) is IdState.PARTIAL
    # Done for every reader, whatever its batch record says (here: gone): its own position
    # is told PARTIAL (dead-letter it again, in case that was lost), any other a DUPLICATE;
    # nothing is ever applied again.
    [(_, record)] = store.records(held.token, [claim])
    redis_client.delete(record)
    other = claim_at(store, claim.message_id, 2)
    assert [o.result for o in store.claim(store.new_token(), [claim, other])] == \
        [ClaimResult.PARTIAL, ClaimResult.DUPLICATE]
    assert store.release(held.token, [claim]) == [ReleaseResult.ALREADY_DONE]
    assert done_one(store, held, effects).result is DoneResult.ALREADY_DONE
    assert redis_client.get(k["a"]) == b"1"
    assert redis_client.exists(record) == 0  # nothing to mark: the key is its own done mark
    # A failing first command applied nothing: EFFECT_ERROR, the claim deleted.
    first = claimed(store, 2)
    outcome = done_one(store, first, [Effect("SADD", k["b"], ("m",)),
                                      Effect("INCRBY", k["marker"], (1,))])
    assert outcome.result is DoneResult.EFFECT_ERROR
    assert outcome.detail.endswith("nothing applied")
    assert redis_client.exists(k["b"], k["marker"]) == 0
    assert state_of(store, first) is IdState.NEW
    # A read the check needs is refused (HGET for HINCRBY of a stored field): refused up front,
    # not a script error.
    redis_client.hset(k["b"], "n", "1")
    unread = claimed(store, 3)
    outcome = done_one(store, unread, [Effect("INCRBY", k["marker"], (1,)),
                                       Effect("HINCRBY", k["b"], ("n", 1))])
    assert outcome.result is DoneResult.EFFECT_ERROR
    assert "checking the commands failed" in outcome.detail
    assert redis_client.exists(k["marker"]) == 0
    assert state_of(store, unread) is IdState.NEW


def test_partial_and_refusals_keep_their_reasons_in_batch_order(
        limited_client: redis.Redis, redis_client: redis.Redis, key_prefix: str,
        k: dict[str, str]) -> None:
    store = DedupStore(limited_client, scope="fx", keys=KeySpace(prefix=key_prefix, shards=1))
    token = store.new_token()
    claims = [claim_at(store, new_message_id(), offset) for offset in range(1, 5)]
    store.claim(token, claims)
    effects = {
        claims[0].message_id: [Effect("INCRBY", k["a"], (1,)),
                               Effect("SADD", f"{key_prefix}:fx:set", ("m",))],
        claims[1].message_id: [Effect("INCRBY", k["a"], (1,))],
        claims[2].message_id: [Effect("SET", k["b"], ("x",)), Effect("INCRBY", k["b"], (1,))],
    }
    outcomes = store.done(token, claims, effects=effects)
    assert [o.result for o in outcomes] == [DoneResult.PARTIAL, DoneResult.OK,
                                            DoneResult.EFFECT_ERROR, DoneResult.OK]
    assert "stay applied" in outcomes[0].detail
    assert "not an integer" in outcomes[2].detail
    assert outcomes[1].detail == outcomes[3].detail == ""
    assert redis_client.get(k["a"]) == b"2"


def random_effect(rng: random.Random, keys: list[str]) -> Effect:
    key = rng.choice(keys)
    now = now_ms()
    value = rng.choice(["0", "1", "-1", "5", str(I64_MAX), str(I64_MIN), str(I64_MAX - 3),
                        "007", "-0", "x", "1.5", ""])
    field = rng.choice(["f", "g"])
    return rng.choice([
        Effect("SET", key, (value,)),
        Effect("SET", key, (value, "PX", rng.choice(["100000", "0", "x"]))),  # no TTL lapses
        Effect("SET", key, (value, rng.choice(["NX", "XX"]))),
        Effect("SET", key, (value, "PXAT", rng.choice([now - 100_000, now + 100_000]))),
        Effect(rng.choice(["INCRBY", "DECRBY"]), key, (value,)),
        Effect("HSET", key, (field, value)),
        Effect("HINCRBY", key, (field, value)),
        Effect("HDEL", key, (field,)),
        Effect(rng.choice(["SADD", "SREM"]), key, (rng.choice("ab"),)),
        Effect(rng.choice(["RPUSH", "LPUSH"]), key, ("x",)),
        Effect("ZADD", key, (rng.choice(["1", "inf", "nan", "1e400", "-2.5", "x"]), "m")),
        Effect("DEL", key),
        Effect(rng.choice(["EXPIRE", "PEXPIRE"]), key, (rng.choice(["100000", "0", "-1", "x"]),)),
        Effect("PEXPIREAT", key, (rng.choice([now - 100_000, now + 100_000]),)),
    ])


def redis_would_fail(client: redis.Redis, keys: list[str], scratch: list[str],
                     effects: Sequence[Effect]) -> bool:
    """Run the commands on copies of the keys, in MULTI: does Redis fail any of them?"""
    client.delete(*scratch)
    for src, dst in zip(keys, scratch, strict=True):
        client.copy(src, dst)
    pipe = client.pipeline(transaction=True)
    for eff in effects:
        pipe.execute_command(eff.command, scratch[keys.index(eff.key)], *eff.args)
    replies = pipe.execute(raise_on_error=False)
    client.delete(*scratch)
    return any(isinstance(reply, Exception) for reply in replies)


def test_random_sequences_are_all_or_nothing_and_match_redis(
        store: DedupStore, redis_client: redis.Redis, key_prefix: str) -> None:
    """The check agrees with Redis: accepted sequences all succeed, refused ones would fail
    (except where the check is stricter by design), nothing is ever half applied."""
    rng = random.Random(20240611)
    keys = [f"{key_prefix}:fx:{i}" for i in range(3)]
    scratch = [f"{key_prefix}:fx:scratch{i}" for i in range(3)]
    counts = {"ok": 0, "refused": 0, "stricter": 0}
    for trial in range(600):
        if rng.random() < 0.3:
            redis_client.delete(*keys)
        effects = [random_effect(rng, keys) for _ in range(rng.randrange(1, 5))]
        fails = redis_would_fail(redis_client, keys, scratch, effects)
        before = dump(redis_client, *keys)
        outcome = done_one(store, claimed(store, trial), effects)
        if outcome.result is DoneResult.OK:
            counts["ok"] += 1
            assert not fails, effects
        else:
            assert outcome.result is DoneResult.EFFECT_ERROR, (outcome, effects)
            assert dump(redis_client, *keys) == before, (outcome.detail, effects)
            counts["refused"] += 1
            if not fails:  # stricter than Redis: only where the outcome is not decidable here
                counts["stricter"] += 1
                shrunk = any(eff.command in ("HDEL", "SREM") for eff in effects)
                assert "may have just" in outcome.detail or "undecidable" in outcome.detail \
                    or (shrunk and "not a " in outcome.detail), (outcome.detail, effects)
    print(counts)
    assert counts["ok"] > 100
    assert counts["refused"] > 100
    assert counts["stricter"] < counts["refused"] // 10
