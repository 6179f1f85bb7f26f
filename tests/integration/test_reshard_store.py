"""Store calls while a slot is half-moved to a master that joined the cluster after the client
started (a fourth master, as resharding under load adds one: tests/fault/chaos/reshard.py).

Two rules of docs/design.md §4 "Redis Cluster" a redirected call must keep:

- "Durability (Redis 7.0)": with ``durability="replicated"`` a round trip is acknowledged only
  once a replica holds its writes; "so is a round trip during which a slot moved (its
  redirected calls ran on another connection)" not acknowledged. A call sent on by ASK runs on
  the importing master, on another connection than the round trip's WAIT.
- "MOVED and ASK are followed": a call sent on by ASK to a master that never loaded eoguard's
  scripts must still run there.

The slot is half-moved with tests/migration_kit.py (its target: the added master), the added
master and its replica come from :class:`eoguard.stack.redis_shard.AddedShard`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

from eoguard.envelope import new_message_id
from eoguard.errors import ReplicationTimeoutError, StoreError, StoreUnavailableError
from eoguard.stack import Endpoints, LocalStack
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_shard import AddedShard
from eoguard.store.client import connect
from eoguard.store.dedup import Claim, DedupStore, RenewResult
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from eoguard.store.replicas import ReplicaWait
from tests.dedup_kit import GRACE_MS, MINE, NEW, claim_of, claim_results, done_results
from tests.migration_kit import SlotMove, free_scope, masters, slot_move, slot_of

pytestmark = [pytest.mark.integration, pytest.mark.cluster(only=True)]

LEASE_MS = TTL_MS = 600_000
REPLICATED = ReplicaWait(replicas=1, timeout_ms=500)


@pytest.fixture
def added(stack: Endpoints) -> Iterator[AddedShard]:
    """A fourth master with its replica, joined (no slots yet); gone after the test."""
    if not stack.redis_managed:
        pytest.fail("adding a master needs the Redis Cluster this stack manages "
                    "(unset EOGUARD_CLUSTER_REDIS_URL)")
    nodes = LocalStack(topology="cluster").redis
    assert isinstance(nodes, RedisClusterNodes)
    shard = AddedShard(nodes)
    shard.join()
    try:
        yield shard
    finally:
        shard.leave()


@pytest.fixture
def store(redis_url: str, key_prefix: str, added: AddedShard) -> Iterator[DedupStore]:
    """A replicated-durability scope of one shard whose slot no other key uses; its client
    started before the slot moves (it knows the added master by no slot)."""
    keys = KeySpace(prefix=key_prefix, shards=1)
    client = connect(redis_url)
    yield DedupStore(client, scope=free_scope(redis_url, keys), keys=keys, lease_ms=LEASE_MS,
                     grace_ms=GRACE_MS, wait=REPLICATED)
    client.close()


def half_move_to(added: AddedShard, redis_url: str, move: SlotMove, keys: list[str]) -> None:
    """Half-move ``move``'s slot to the added master, with ``keys`` migrated there."""
    seed = redis.Redis.from_url(redis_url)
    try:
        every = masters(seed)
    finally:
        seed.close()
    new = next(m for m in every if m.id == added.node_id())
    move.target = new
    move.others = [m for m in every if m not in (move.source, new)]
    move.begin()
    move.migrate(*keys)


def test_a_call_sent_on_by_ask_to_a_master_the_client_does_not_know_runs_there(
        store: DedupStore, added: AddedShard, redis_url: str) -> None:
    """TA's batch record moves to the added master, which serves no slot yet: the client's
    slot map does not name it, and it holds no eoguard script. A lease renewal (one key) is
    sent on by ASK. redis-py 8.1 looks the ASK's node up in its map, finds none and fails with
    AttributeError ('NoneType' object has no attribute 'redis_connection'; redis-py #2432),
    which no eoguard caller expects (the chaos run's producers and consumers crashed on it).
    The call must run there (RENEWED): at worst fail StoreError, a retry."""
    ta = store.new_token()
    claims = [claim_of(store, new_message_id(), i, ttl_ms=TTL_MS) for i in range(2)]
    assert claim_results(store, ta, claims) == [NEW] * 2
    plain = DedupStore(store.client, scope=store.scope, keys=store.keys, lease_ms=LEASE_MS,
                       grace_ms=GRACE_MS)  # local durability: the ASK alone is the question
    with slot_move(redis_url, slot_of(store.keys, store.scope)) as move:
        half_move_to(added, redis_url, move, [store.keys.dedup_batch(store.scope, 0, ta)])
        try:
            renewed = plain.renew(plain.records(ta, claims))
        except StoreError as exc:  # allowed, though the design promises ASK is followed
            pytest.fail(f"the renewal failed StoreError while its slot moved: {exc}")
        assert renewed == [RenewResult.RENEWED]
        move.finish()


def test_a_read_sent_on_by_ask_to_a_master_the_client_does_not_know_is_a_retry(
        store: DedupStore, added: AddedShard, redis_url: str) -> None:
    """A plain read (Outbox.get, as the chaos run's producers read a record to send it again)
    goes through redis-py's own redirections, not eoguard's: its ASK to the added master,
    which serves no slot yet, failed with AttributeError and crashed a producer (chaos cluster
    seed 3). It is StoreUnavailableError: a retry."""
    outbox = Outbox(store.client, store.keys)
    message_id = new_message_id()
    key = store.keys.outbox_record(message_id)
    store.client.set(key, b"not read")
    with slot_move(redis_url, key_slot(key.encode())) as move:
        half_move_to(added, redis_url, move, [key])
        with pytest.raises(StoreUnavailableError, match="does not know yet"):
            outbox.get(message_id)  # redis-py 8.1 (pinned) cannot follow this ASK
        move.finish()
    store.client.delete(key)


def test_a_done_mark_run_by_ask_is_acknowledged_only_once_its_master_replicated_it(
        store: DedupStore, added: AddedShard, redis_url: str, key_prefix: str) -> None:
    """Pass TA claims, pass TB re-owns the same records (MINE: TA's re-owned hash exists); the
    client knows the added master (it serves one slot: the client followed a MOVED there), the
    replica of which is paused. Every key of TA's slot moves to the added master: TA's done
    mark (declaring TA's record and re-owned hash) finds none on the source, is sent on by ASK
    and runs on the added master. The round trip's WAIT went to the source, whose replica holds
    everything; the done mark (with a handler's effects, if any) is on a master no replica
    acknowledged, and the consumer would commit the offsets on it. It must not be
    acknowledged: ReplicationTimeoutError (a retry), as for a MOVED during the round trip."""
    ta, tb = store.new_token(), store.new_token()
    claims = [claim_of(store, new_message_id(), i, ttl_ms=TTL_MS) for i in range(3)]
    assert claim_results(store, ta, claims) == [NEW] * 3
    assert claim_results(store, tb, claims) == [MINE] * 3
    scope_keys = [store.keys.dedup_batch(store.scope, 0, ta),
                  store.keys.dedup_batch(store.scope, 0, tb),
                  store.keys.dedup_reowned(store.scope, 0, ta),
                  *(store.key(c.message_id) for c in claims)]
    known = KeySpace(prefix=f"{key_prefix}k", shards=1)  # an empty slot, moved for good
    known_scope = free_scope(redis_url, known)
    with slot_move(redis_url, slot_of(known, known_scope)) as other, \
            slot_move(redis_url, slot_of(store.keys, store.scope)) as move:
        half_move_to(added, redis_url, other, [])
        other.finish()
        store.client.get(known.dedup_batch(known_scope, 0, "x"))  # MOVED: the client learns it
        half_move_to(added, redis_url, move, scope_keys)
        replica = added.replica.pid()
        assert replica is not None
        os.killpg(replica, signal.SIGSTOP)
        try:
            outcome = _done_or_timeout(store, ta, claims)
        finally:
            os.killpg(replica, signal.SIGCONT)
        move.finish()
    assert outcome == "ReplicationTimeoutError", (
        f"TA's done mark ran on the added master by ASK and was acknowledged ({outcome}) "
        f"while no replica of that master held it")


def _done_or_timeout(store: DedupStore, token: str, claims: list[Claim]) -> str:
    try:
        return str(done_results(store, token, claims))
    except ReplicationTimeoutError:
        return "ReplicationTimeoutError"
