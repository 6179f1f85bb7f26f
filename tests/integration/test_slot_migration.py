"""The dedup scripts while their hash slot is half-moved between two masters of the cluster.

The scripts touch keys their KEYS do not declare: a holder's batch record, a holder's re-owned
hash, the claim keys a simple done takes back. Redis checks only the declared keys before a
script runs; mid-script, a command on an undeclared key that the migrating source no longer
holds fails the script and keeps its earlier writes, and on the importing target such a key
still on the source reads as missing. Each test half-moves its scope's slot key by key in an
order it chooses (tests/migration_kit.py) and calls the store after each step. The contract
(docs/design.md §4 "Redis Cluster", STYLE.md habit 12): every call answers rightly or raises
StoreError having written nothing; once the move is finished (or rolled back), a retry answers
rightly, each effect is applied once, and no claim under a live lease is taken over.

The passes: TA claims first; TB reads the same records again (a rebalance with a zombie: same
positions, so its claims are MINE); a third pass reads them elsewhere (another position).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.dedup import Claim, DedupStore, DoneResult, Effect, IdState, ReleaseResult, RenewResult
from eoguard.store.keys import KeySpace
from tests.dedup_kit import BUSY, DUPLICATE, GRACE_MS, MINE, NEW, claim_of, claim_results, done_results
from tests.migration_kit import SlotMove, attempt, free_scope, show, slot_move, slot_of, steps

pytestmark = [pytest.mark.integration, pytest.mark.cluster(only=True)]

OK, ALREADY_DONE = DoneResult.OK, DoneResult.ALREADY_DONE
ENDS = ["finish", "rollback"]  # how the half-move ends: SlotMove.finish or SlotMove.rollback
LEASE_MS = 600_000  # every lease stays live through the test: none may lapse between steps
TTL_MS = 600_000


@pytest.fixture
def store(redis_client: redis.Redis[bytes], redis_url: str, key_prefix: str) -> DedupStore:
    """A scope of one shard whose slot no other key uses: the slot each test moves."""
    keys = KeySpace(prefix=key_prefix, shards=1)
    return DedupStore(redis_client, scope=free_scope(redis_url, keys), keys=keys,
                      lease_ms=LEASE_MS, grace_ms=GRACE_MS)


@pytest.fixture
def move(store: DedupStore, redis_url: str) -> Iterator[SlotMove]:
    """The store's slot, not moving yet (the test begins after its setup); put back after."""
    with slot_move(redis_url, slot_of(store.keys, store.scope)) as moving:
        yield moving


def claim(store: DedupStore, offset: int, message_id: str | None = None) -> Claim:
    """A claim at ``offset`` of the one reader and partition (a new message unless given)."""
    return claim_of(store, message_id or new_message_id(), offset, ttl_ms=TTL_MS)


def record(store: DedupStore, token: str) -> str:
    return store.keys.dedup_batch(store.scope, 0, token)


def reowned(store: DedupStore, token: str) -> str:
    return store.keys.dedup_reowned(store.scope, 0, token)


def counter(store: DedupStore, client: redis.Redis[bytes], of: Claim) -> str:
    """An effect key of ``of``, created now: an effect key is declared, and one that exists on
    neither node would keep every call TRYAGAIN instead of letting the script run."""
    key = store.effect_key(of.message_id, f"n-{of.message_id}")
    client.set(key, 0, px=TTL_MS)  # INCRBY keeps the TTL: gone after the test
    return key


def count(client: redis.Redis[bytes], key: str) -> int:
    return int(client.get(key) or 0)


# Done with effects ---------------------------------------------------------------------------
DONE_ORDERS = {
    "holder record first": ("TB's record", "X2", "TA's record", "TA's re-owned hash", "X1",
                              "X1's effect", "X2's effect"),
    # Once X2's effect moves, every key TA's done declares is on the target: it runs there,
    # TB's record still on the source.
    "claim key first": ("X2", "TA's record", "TA's re-owned hash", "X1", "X1's effect",
                        "X2's effect", "TB's record"),
}


def reowned_pair(store: DedupStore, redis_client: redis.Redis[bytes]
                 ) -> tuple[str, str, tuple[Claim, Claim], tuple[str, str], dict[str, list[Effect]]]:
    """TA claimed X1 and X2, TB re-owned X2: the tokens, the claims, a counter per claim and
    an effect incrementing each."""
    ta, tb = store.new_token(), store.new_token()
    x1, x2 = claim(store, 1), claim(store, 2)
    assert claim_results(store, ta, [x1, x2]) == [NEW, NEW]
    assert claim_results(store, tb, [x2]) == [MINE]
    c1, c2 = counter(store, redis_client, x1), counter(store, redis_client, x2)
    effects = {x1.message_id: [Effect("INCRBY", c1, (1,))],
               x2.message_id: [Effect("INCRBY", c2, (1,))]}
    return ta, tb, (x1, x2), (c1, c2), effects


@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("order", DONE_ORDERS)
def test_done_with_effects_takes_back_a_reowned_claim_once(
        order: str, end: str, store: DedupStore, move: SlotMove,
        redis_client: redis.Redis[bytes]) -> None:
    """The issue: TA claimed X1 and X2; TB re-owned X2 and is not done. TA's done with effects,
    half-moved, applies X1's effect and takes X2 back, or fails having applied nothing; once
    the move is finished or rolled back, a retry settles both, each effect applied once, and
    TB's done finds X2 done."""
    ta, tb, (x1, x2), (c1, c2), effects = reowned_pair(store, redis_client)
    keys = {"TB's record": record(store, tb), "X2": x2.key, "TA's record": record(store, ta),
            "TA's re-owned hash": reowned(store, ta), "X1": x1.key, "X1's effect": c1,
            "X2's effect": c2}
    move.name(TA=ta, TB=tb)
    move.begin()
    first = steps(move, {label: keys[label] for label in DONE_ORDERS[order]},
                  lambda: done_results(store, ta, [x1, x2], effects=effects), "TA's done")
    assert first in (None, [OK, OK])
    getattr(move, end)()
    again = done_results(store, ta, [x1, x2], effects=effects)
    assert again == ([OK, OK] if first is None else [ALREADY_DONE, ALREADY_DONE])
    assert done_results(store, tb, [x2], effects=effects) == [ALREADY_DONE]
    assert (count(redis_client, c1), count(redis_client, c2)) == (1, 1)
    print(f"  {order}, {end}: TA's done {show(again)} after, TB's done ALREADY_DONE, "
          "each effect applied once")


def test_done_on_the_importing_node_leaves_a_claim_done_first_by_its_reowner(
        store: DedupStore, move: SlotMove, redis_client: redis.Redis[bytes]) -> None:
    """TB re-owned X2 and was done first, applying X2's effect. TA's done runs on the importing
    node (every key it declares moved) with TB's record still on the source: it must not read
    TB as not done, take X2 back and apply X2's effect a second time."""
    ta, tb, (x1, x2), (c1, c2), effects = reowned_pair(store, redis_client)
    assert done_results(store, tb, [x2], effects=effects) == [OK]
    move.name(TA=ta, TB=tb)
    move.begin()
    first = steps(move, {"X1": x1.key, "X2": x2.key, "TA's record": record(store, ta),
                         "TA's re-owned hash": reowned(store, ta), "X1's effect": c1,
                         "X2's effect": c2},
                  lambda: done_results(store, ta, [x1, x2], effects=effects), "TA's done")
    assert first in (None, [OK, ALREADY_DONE]), \
        f"TA's done took X2 back from TB, done first: X2's effect applied {count(redis_client, c2)}x"
    move.finish()
    again = done_results(store, ta, [x1, x2], effects=effects)
    assert again == ([OK, ALREADY_DONE] if first is None else [ALREADY_DONE, ALREADY_DONE])
    assert (count(redis_client, c1), count(redis_client, c2)) == (1, 1)
    print(f"  TA's done {show(first)} half-moved, {show(again)} after: X2's effect applied "
          "once, by TB")


# Simple done ---------------------------------------------------------------------------------
SIMPLE_ORDERS = {
    "claim key first": ("X2", "TB's record", "TA's record", "TA's re-owned hash"),
    "holder record first": ("TB's record", "X2", "TA's record", "TA's re-owned hash"),
}


@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("order", SIMPLE_ORDERS)
def test_a_simple_done_never_loses_the_reowned_claims(order: str, end: str, store: DedupStore,
                                                      move: SlotMove) -> None:
    """TA claimed X1 and X2; TB re-owned X2. TA's simple done declares no claim key and takes
    X2 back through its re-owned hash: half-moved it does, or fails having written nothing (a
    re-owned hash deleted before a failure would leave X2 to TB). Afterwards X2 is TA's and
    done: TB abandoned, a read elsewhere finds both DUPLICATE, never NEW."""
    ta, tb = store.new_token(), store.new_token()
    x1, x2 = claim(store, 1), claim(store, 2)
    assert claim_results(store, ta, [x1, x2]) == [NEW, NEW]
    assert claim_results(store, tb, [x2]) == [MINE]
    keys = {"X2": x2.key, "TB's record": record(store, tb), "TA's record": record(store, ta),
            "TA's re-owned hash": reowned(store, ta)}
    move.name(TA=ta, TB=tb, X1=x1.key)
    move.begin()
    first = steps(move, {label: keys[label] for label in SIMPLE_ORDERS[order]},
                  lambda: done_results(store, ta, [x1, x2]), "TA's simple done")
    assert first in (None, [OK, OK])
    getattr(move, end)()
    assert done_results(store, ta, [x1, x2]) == [OK, OK]
    entry = store.check(x2.message_id)
    assert entry is not None
    assert (entry.token, entry.id_state(now_ms())) == (ta, IdState.DONE)
    store.give_back(store.records(tb, [x2]))  # TB abandoned: its lease ends now
    elsewhere = [claim(store, 7, x1.message_id), claim(store, 8, x2.message_id)]
    assert claim_results(store, store.new_token(), elsewhere) == [DUPLICATE, DUPLICATE]
    print(f"  {order}, {end}: X2 done by TA; after TB gave up, read elsewhere: DUPLICATE")


# Claim ---------------------------------------------------------------------------------------
MINE_ORDERS = {
    "holder keys first": ("TA's re-owned hash", "TA's record", "X", "TB's record", "W"),
    # Once TB's record moves, TB's claim runs on the target, TA's keys still on the source.
    "claimed keys first": ("X", "TB's record", "TA's record", "TA's re-owned hash", "W"),
}


@pytest.mark.parametrize("order", MINE_ORDERS)
def test_a_reown_is_noted_in_the_holders_reowned_hash(order: str, store: DedupStore,
                                                      move: SlotMove) -> None:
    """TA holds W and X under a live lease; TB (same positions) re-owned W, so TA's re-owned
    hash exists. TB's claim of X, half-moved, re-owns X and notes it in that one hash, or fails
    having written nothing. Afterwards, TB abandoned, TA's done takes both back: no record is
    left undone."""
    ta, tb = store.new_token(), store.new_token()
    w, x = claim(store, 1), claim(store, 2)
    assert claim_results(store, ta, [w, x]) == [NEW, NEW]
    assert claim_results(store, tb, [w]) == [MINE]
    keys = {"TA's re-owned hash": reowned(store, ta), "TA's record": record(store, ta),
            "X": x.key, "TB's record": record(store, tb), "W": w.key}
    move.name(TA=ta, TB=tb)
    move.begin()
    first = steps(move, {label: keys[label] for label in MINE_ORDERS[order]},
                  lambda: claim_results(store, tb, [x]), "TB's claim of X")
    assert first in (None, [MINE])
    move.finish()  # fails on a key written on both nodes
    assert claim_results(store, tb, [x]) == [MINE]
    store.give_back(store.records(tb, [x]))  # TB abandoned
    assert done_results(store, ta, [w, x]) == [OK, OK]
    elsewhere = [claim(store, 7, w.message_id), claim(store, 8, x.message_id)]
    assert claim_results(store, store.new_token(), elsewhere) == [DUPLICATE, DUPLICATE]
    print(f"  {order}: TB's claim {show(first)} half-moved; TA's done took W and X back")


@pytest.mark.parametrize("holder", ["live", "done"])
def test_a_claim_on_the_importing_node_never_takes_over_a_held_claim(
        holder: str, store: DedupStore, move: SlotMove) -> None:
    """TA holds X (its lease live, or its batch done); TB claimed Y first, so its record exists.
    X's claim key and TB's record move, TA's record stays: TB's claim of X at another position
    runs on the target, where TA's record reads as missing. It must answer BUSY (DUPLICATE when
    TA is done), or fail having written nothing: never NEW, a second handling of X."""
    ta, tb = store.new_token(), store.new_token()
    x = claim(store, 1)
    assert claim_results(store, ta, [x]) == [NEW]
    if holder == "done":
        assert done_results(store, ta, [x]) == [OK]
    assert claim_results(store, tb, [claim(store, 5)]) == [NEW]
    elsewhere = claim(store, 9, x.message_id)
    right = [BUSY] if holder == "live" else [DUPLICATE]
    move.name(TA=ta, TB=tb)
    move.begin()
    first = steps(move, {"X": x.key, "TB's record": record(store, tb)},
                  lambda: claim_results(store, tb, [elsewhere]), "TB's claim of X elsewhere")
    assert first in (None, right), f"TB took X over from TA, its batch {holder}"
    move.finish()
    assert claim_results(store, tb, [elsewhere]) == right
    entry = store.check(x.message_id)
    assert entry is not None
    assert entry.token == ta
    print(f"  TA {holder}: TB's claim elsewhere {show(first)} half-moved, {show(right)} "
          "after; X still TA's")


# Release and renew ---------------------------------------------------------------------------
def test_release_and_renew_touch_only_their_declared_keys(store: DedupStore,
                                                          move: SlotMove) -> None:
    """Release and renew declare every key they touch: half-moved, each answers or fails
    having written nothing; after the move a retry answers."""
    ta = store.new_token()
    x1, x2 = claim(store, 1), claim(store, 2)
    assert claim_results(store, ta, [x1, x2]) == [NEW, NEW]
    records = store.records(ta, [x1])
    move.name(TA=ta)
    move.begin()
    renewed = attempt(move, lambda: store.renew(records), "TA's renew")
    assert renewed in (None, [RenewResult.RENEWED])
    released = steps(move, {"X2": x2.key, "TA's record": record(store, ta), "X1": x1.key},
                     lambda: store.release(ta, [x1, x2]), "TA's release")
    assert released in (None, [ReleaseResult.OK] * 2)
    renewed = attempt(move, lambda: store.renew(records), "TA's renew, its record moved")
    assert renewed in (None, [RenewResult.RENEWED])
    move.finish()
    assert store.renew(records) == [RenewResult.RENEWED]
    again = [ReleaseResult.OK if released is None else ReleaseResult.NOT_OWNED] * 2
    assert store.release(ta, [x1, x2]) == again
    assert store.check(x1.message_id) is None
    assert store.check(x2.message_id) is None
    print(f"  release {show(released)} half-moved, {show(again)} after; renew RENEWED")
