"""A fresh pass's claims (store/dedup_fresh.py) against real Redis: the same outcomes, keys and
expiries as the script's, with the script's rules kept where the plain SETs cannot judge.

Every outcome is checked against the script path on a twin scope holding the same state: the
fresh path must be the script's answer, written by other means.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.client import connect
from eoguard.store.dedup import Claim, ClaimResult, DedupStore
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import Command
from tests.dedup_kit import (
    GRACE_MS,
    LEASE_MS,
    calls_since,
    claim_of,
    command_calls,
    keys_under,
    value,
)

pytestmark = pytest.mark.integration

MAX_TTL_MS = 3_600_000
NEW, MINE, DONE_HERE, DUPLICATE, BUSY, EXPIRED, _, STALE = tuple(ClaimResult)[:8]


def scoped(client: redis.Redis, prefix: str, scope: str, shards: int = 16) -> DedupStore:
    return DedupStore(client, scope=scope, lease_ms=LEASE_MS, grace_ms=GRACE_MS,
                      keys=KeySpace(prefix=prefix, max_ttl_ms=MAX_TTL_MS, shards=shards))


def results(store: DedupStore, token: str, claims: Sequence[Claim], *, fresh: bool
            ) -> list[tuple[ClaimResult, bool]]:
    """Each claim's result, and whether its holder is the claiming pass (for BUSY)."""
    report = store._run(store.prepare_claim(token, claims, fresh=fresh), "claiming")
    return [(result, report.holders.get(i) == token) for i, result in enumerate(report.results)]


def build_state(store: DedupStore) -> Callable[[], list[Claim]]:
    """The state every outcome needs, made by the script path; returns the batch to claim."""
    ids = {name: new_message_id() for name in
           ("busy", "done_elsewhere", "done_here", "mine", "fresh", "twice", "expired", "far")}
    live, done, reread = store.new_token(), store.new_token(), store.new_token()
    store.claim(live, [claim_of(store, ids["busy"], 900)])
    done_claims = [claim_of(store, ids["done_elsewhere"], 901), claim_of(store, ids["done_here"], 3)]
    store.claim(done, done_claims)
    store.done(done, done_claims)
    store.claim(reread, [claim_of(store, ids["mine"], 4)])

    def batch() -> list[Claim]:
        now = now_ms()
        return [claim_of(store, ids["fresh"], 1), claim_of(store, ids["busy"], 2),
                claim_of(store, ids["done_here"], 3), claim_of(store, ids["mine"], 4),
                claim_of(store, ids["done_elsewhere"], 5), claim_of(store, ids["twice"], 6),
                claim_of(store, ids["twice"], 7),
                store.new_claim(ids["expired"], claim_of(store, "x", 8).position, now - 1),
                store.new_claim(ids["far"], claim_of(store, "x", 9).position,
                                now + 10 * MAX_TTL_MS)]
    return batch


def test_a_fresh_pass_answers_what_the_script_answers(redis_client: redis.Redis,
                                                      key_prefix: str) -> None:
    script, fresh = (scoped(redis_client, key_prefix, scope) for scope in ("script", "fresh"))
    warm = fresh.new_token()  # a first pass reads Redis's clock: the fresh path starts after it
    fresh.claim(warm, [claim_of(fresh, new_message_id(), 0)], fresh=True)
    assert fresh.redis_now_ms is not None
    by_script = results(script, script.new_token(), build_state(script)(), fresh=False)
    token = fresh.new_token()
    claims = build_state(fresh)()
    by_fresh = results(fresh, token, claims, fresh=True)
    print("script:", [(r.name, own) for r, own in by_script])
    print("fresh: ", [(r.name, own) for r, own in by_fresh])
    assert by_fresh == by_script
    assert [r for r, _ in by_fresh] == [NEW, BUSY, DONE_HERE, MINE, DUPLICATE, NEW, BUSY,
                                        EXPIRED, NEW]
    assert by_fresh[6] == (BUSY, True)  # the second copy waits on this very pass
    now = now_ms()
    expired_key, far_key = claims[7].key, claims[8].key
    assert redis_client.exists(expired_key) == 0, "an expired message leaves no claim key"
    far_at = int(redis_client.pexpiretime(far_key))
    assert far_at <= now + MAX_TTL_MS + GRACE_MS, "the far expiry is clamped by Redis's clock"
    for claim in (claims[0], claims[5]):  # written by the plain SETs
        assert value(redis_client, claim.key) == f"c|{token}|{claim.position}"
        assert int(redis_client.pexpiretime(claim.key)) == claim.expires_at_ms + GRACE_MS
        [(_, record)] = fresh.records(token, [claim])
        raw = value(redis_client, record)
        assert raw is not None
        assert raw.startswith("o|"), raw
        assert int(raw[2:]) >= fresh.redis_now_ms + LEASE_MS  # type: ignore[operator]
        assert int(redis_client.pexpiretime(record)) >= claim.expires_at_ms + GRACE_MS
    # The done mark covers the fresh claims as it covers the script's.
    ours = [claims[i] for i in (0, 3, 5, 8)]  # NEW, MINE, NEW, NEW (clamped)
    assert {d.result.name for d in fresh.done(token, ours)} == {"OK"}
    again = fresh.new_token()
    assert [r for r, _ in results(fresh, again, ours, fresh=True)] == [DONE_HERE] * 4


def test_fresh_passes_write_plain_sets_after_one_open(own_redis: redis.Redis) -> None:
    store = DedupStore(own_redis, scope="s", lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    first, second = store.new_token(), store.new_token()
    before = command_calls(own_redis)
    store.claim(first, [claim_of(store, new_message_id(), i) for i in range(300)], fresh=True)
    on_first = calls_since(own_redis, before)
    before = command_calls(own_redis)
    claims = [claim_of(store, new_message_id(), 300 + i) for i in range(300)]
    assert [o.result for o in store.claim(second, claims, fresh=True)] == [NEW] * 300
    on_second = calls_since(own_redis, before)
    print(f"first pass: {on_first}\nsecond pass: {on_second}")
    assert on_first.get("evalsha") == 1  # the script (and a TIME)
    assert "eval" not in on_first
    assert on_second.get("eval") == 1  # the open, then the SETs
    assert on_second.get("set", 0) >= 300
    assert "evalsha" not in on_second


def test_a_server_that_lost_its_scripts_still_opens_first(own_redis: redis.Redis) -> None:
    store = DedupStore(own_redis, scope="s", lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    store.claim(store.new_token(), [claim_of(store, new_message_id(), 0)], fresh=True)
    own_redis.script_flush()
    token = store.new_token()
    claims = [claim_of(store, new_message_id(), 1 + i) for i in range(50)]
    assert [o.result for o in store.claim(token, claims, fresh=True)] == [NEW] * 50
    for _, record in store.records(token, claims):
        raw = value(own_redis, record)
        assert raw is not None, record
        assert raw.startswith("o|"), (record, raw)


def test_a_resent_fresh_pass_finds_its_own_claims_mine(redis_client: redis.Redis,
                                                       key_prefix: str) -> None:
    # redis-py resends a pipeline after a dropped connection; if the first send ran, the open
    # finds the pass's records: every claim goes to the script, which finds them its own.
    store = scoped(redis_client, key_prefix, "s")
    store.claim(store.new_token(), [claim_of(store, new_message_id(), 0)], fresh=True)  # clock
    token = store.new_token()
    claims = [claim_of(store, new_message_id(), 1 + i) for i in range(40)]
    prepared = store.prepare_claim(token, claims, fresh=True)
    [first] = store.run([prepared])
    [resent] = store.run([prepared])
    assert first.results == [NEW] * 40
    assert resent.results == [MINE] * 40
    for claim in claims:
        assert value(redis_client, claim.key) == f"c|{token}|{claim.position}"


def test_a_done_token_claimed_fresh_again_keeps_no_claim_of_the_second_pass(
        redis_client: redis.Redis, key_prefix: str) -> None:
    store = scoped(redis_client, key_prefix, "s", shards=1)  # one record: the token's, done
    token = store.new_token()
    store.claim(token, [claim_of(store, new_message_id(), 0)], fresh=True)  # the clock
    first = [claim_of(store, new_message_id(), 1 + i) for i in range(40)]
    store.claim(token, first)
    store.done(token, first)
    before = keys_under(redis_client, key_prefix)
    later = [claim_of(store, new_message_id(), 100 + i) for i in range(40)]
    assert [o.result for o in store.claim(token, later, fresh=True)] == [STALE] * 40
    assert keys_under(redis_client, key_prefix) == before, \
        "a claim under a done token would mark a message nobody handled"


def test_a_clock_read_ahead_of_redis_never_lets_a_claim_outlive_the_bound(
        redis_client: redis.Redis, key_prefix: str) -> None:
    # As if Redis's clock stepped back an hour since the store read it: a claim within the
    # bound by the stale clock but past it by Redis's own is claimed again by the script.
    store = scoped(redis_client, key_prefix, "s")
    store.claim(store.new_token(), [claim_of(store, new_message_id(), 0)], fresh=True)
    assert store.redis_now_ms is not None
    store.redis_now_ms += 3_600_000
    token = store.new_token()
    edge = store.new_claim(new_message_id(), claim_of(store, "x", 1).position,
                           now_ms() + MAX_TTL_MS + 1_800_000)
    near = claim_of(store, new_message_id(), 2)
    assert [o.result for o in store.claim(token, [edge, near], fresh=True)] == [NEW, NEW]
    bound = now_ms() + MAX_TTL_MS + GRACE_MS
    [(_, record)] = store.records(token, [edge])
    edge_at = int(redis_client.pexpiretime(edge.key))
    print(f"edge claim expires {bound - edge_at} ms before the bound; its record at "
          f"{int(redis_client.pexpiretime(record)) - edge_at} ms after it")
    assert edge_at <= bound
    assert int(redis_client.pexpiretime(record)) >= edge_at


@pytest.mark.cluster(only=True)
def test_on_redis_cluster_a_fresh_pass_goes_to_the_script(redis_client: redis.Redis,
                                                          key_prefix: str) -> None:
    store = scoped(redis_client, key_prefix, "s")
    for _ in range(2):  # the second pass would be the plain one on a single node
        token = store.new_token()
        claims = [claim_of(store, new_message_id(), i) for i in range(40)]
        prepared = store.prepare_claim(token, claims, fresh=True)
        assert not any(isinstance(call, Command) for call in prepared.calls)
        assert [o.result for o in store.claim(token, claims, fresh=True)] == [NEW] * 40


@pytest.mark.cluster
def test_fresh_and_scripted_passes_racing_on_the_same_ids_take_each_once(
        redis_url: str, key_prefix: str) -> None:
    # Four stores on clients of their own claim overlapping random draws of the same 600 ids,
    # two by fresh passes and two by the script, each pass at positions of its own (so no
    # claim is MINE): an id is NEW to exactly one pass, whatever the interleaving, and is done.
    # (On Redis Cluster every pass is the script's: the race of the script with itself.)
    ids = [new_message_id() for _ in range(600)]
    new_by: dict[str, list[str]] = {message_id: [] for message_id in ids}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        client = connect(redis_url)
        store = scoped(client, key_prefix, "race")  # type: ignore[arg-type]
        rng = random.Random(worker)
        try:
            for n in range(25):
                token = store.new_token()
                draw = rng.sample(ids, 120)
                claims = [claim_of(store, message_id, (worker * 100 + n) * 1000 + i)
                          for i, message_id in enumerate(draw)]
                report = store.claim(token, claims, fresh=worker % 2 == 0)
                ours = [o.claim for o in report if o.result is NEW]
                assert not [o for o in report if o.result not in (NEW, BUSY, DUPLICATE)], report
                with lock:
                    for claim in ours:
                        new_by[claim.message_id].append(token)
                store.done(token, ours)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    taken = {message_id: len(tokens) for message_id, tokens in new_by.items() if tokens}
    print(f"{len(taken)} of {len(ids)} ids claimed NEW; most passes that took one id: "
          f"{max(taken.values())}")
    assert set(taken.values()) == {1}
    checker = scoped(connect(redis_url), key_prefix, "race")  # type: ignore[arg-type]
    now = now_ms()
    states = {entry.id_state(now).name if entry else "ABSENT"
              for entry in map(checker.check, taken)}
    assert states == {"DONE"}, states


def test_claims_expired_by_the_clock_read_go_to_the_script(redis_client: redis.Redis,
                                                           key_prefix: str) -> None:
    # Expiries at or before the clock the store read (0 among them: a PXAT of 0 is no
    # expiry a SET takes) are the script's to judge; the rest of the pass still opens first.
    store = DedupStore(redis_client, scope="s", lease_ms=LEASE_MS, grace_ms=0,
                       keys=KeySpace(prefix=key_prefix, max_ttl_ms=MAX_TTL_MS))
    store.claim(store.new_token(), [claim_of(store, new_message_id(), 0)], fresh=True)
    token = store.new_token()
    at = claim_of(store, "x", 1).position
    claims = [store.new_claim(new_message_id(), at, 0),
              store.new_claim(new_message_id(), at + "0", now_ms() - 1),
              claim_of(store, new_message_id(), 3)]
    assert [o.result for o in store.claim(token, claims, fresh=True)] == [EXPIRED, EXPIRED, NEW]
    assert [redis_client.exists(c.key) for c in claims] == [0, 0, 1]
