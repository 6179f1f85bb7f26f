"""The cluster topology itself, and what only a real Redis Cluster can show: a client found from
any node, shards spread over the masters, scripts following a hash slot that moves."""

from __future__ import annotations

import pytest
import redis
from confluent_kafka.admin import AdminClient, ConfigResource
from redis.cluster import RedisCluster

from eoguard.config import RedisConfig
from eoguard.errors import StoreError
from eoguard.stack import Endpoints
from eoguard.store.dedup import DedupStore, DoneResult
from eoguard.store.keys import KeySpace
from tests.dedup_kit import (
    DONE_HERE,
    GRACE_MS,
    LEASE_MS,
    NEW,
    claim_of,
    claim_results,
    done_results,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster(only=True)]


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port)


def test_three_masters_with_a_replica_each_and_replicated_topics(stack: Endpoints, new_topic
                                                                 ) -> None:
    client = RedisCluster.from_url(stack.redis_url)
    try:
        masters, replicas = client.get_primaries(), client.get_replicas()
        assert (len(masters), len(replicas)) == (3, 3)
        for node in masters + replicas:
            one = _node(node.port)
            info = one.execute_command("CLUSTER INFO")
            assert info["cluster_state"] == "ok"
            assert info["cluster_slots_ok"] == "16384"
            assert one.config_get("appendonly") == {"appendonly": "yes"}
            assert one.config_get("cluster-node-timeout") == {"cluster-node-timeout": "2000"}
            one.close()
    finally:
        client.close()
    topic = new_topic(2)
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    meta = admin.list_topics(timeout=10)
    assert len(meta.brokers) == 3
    assert {len(p.replicas) for p in meta.topics[topic].partitions.values()} == {3}
    [conf] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    assert conf.result(timeout=10)["min.insync.replicas"].value == "2"


def test_the_url_of_any_node_gives_a_cluster_client(stack: Endpoints) -> None:
    seed = RedisCluster.from_url(stack.redis_url)
    ports = [n.port for n in seed.get_primaries() + seed.get_replicas()]
    seed.close()
    for port in ports:
        client = RedisConfig(url=f"redis://127.0.0.1:{port}/0").connect()
        assert isinstance(client, RedisCluster)
        client.close()
    single = RedisConfig(url=stack.redis_url, cluster=False).connect()
    assert type(single) is redis.Redis
    single.close()


def test_the_default_shards_of_a_scope_spread_over_every_master(redis_client) -> None:
    keys = KeySpace(prefix="spread")
    for scope in ("app", "billing", "shipping"):
        owners = {redis_client.get_node_from_key(p + "x").name for p in keys.dedup_prefixes(scope)}
        assert len(owners) == 3, (scope, owners)
    outbox = {redis_client.get_node_from_key(keys.outbox_index(s)).name for s in range(keys.shards)}
    assert len(outbox) == 3


def _move_slot(client: RedisCluster, slot: int) -> tuple[str, str]:
    """Migrate ``slot``'s keys to another master (MIGRATING/IMPORTING, MIGRATE), leaving the
    slot in migration; the source's and the target's names."""
    source = client.nodes_manager.get_node_from_slot(slot)
    target = next(n for n in client.get_primaries() if n.name != source.name)
    src, dst = _node(source.port), _node(target.port)
    src_id = src.execute_command("CLUSTER MYID").decode()
    dst_id = dst.execute_command("CLUSTER MYID").decode()
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    names = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if names:
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *names)
    src.close()
    dst.close()
    return source.name, target.name


def _move_slot_finish(client: RedisCluster, slot: int, target: str) -> None:
    """Hand ``slot`` over to ``target`` on every master (CLUSTER SETSLOT NODE)."""
    port = int(target.rsplit(":", 1)[1])
    dst_id = _node(port).execute_command("CLUSTER MYID").decode()
    for node in client.get_primaries():
        one = _node(node.port)
        one.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        one.close()


def test_scripts_follow_a_slot_in_migration_and_after_it_moved(redis_client, key_prefix) -> None:
    # One shard: every key of the batch in one slot, the slot this test moves. The store's
    # client keeps its slot map from before the move.
    store = DedupStore(redis_client, scope="moving", keys=KeySpace(prefix=key_prefix, shards=1),
                       lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    token = store.new_token()
    claims = [claim_of(store, f"m-{i}", i) for i in range(20)]
    assert claim_results(store, token, claims) == [NEW] * 20
    slot = redis_client.keyslot(claims[0].key)
    source, target = _move_slot(redis_client, slot)
    try:
        assert redis_client.get_node_from_key(claims[0].key).name == source  # the stale map
        # Mid-migration the source sends ASK; the target, asked, refuses a script over several
        # keys of which one (the re-owned hash) exists nowhere yet: TRYAGAIN until the slot is
        # handed over. redis-py retries, then gives up: a StoreError, retried later.
        with pytest.raises(StoreError, match="marking a batch done"):
            store.done(token, claims)
    finally:
        _move_slot_finish(redis_client, slot, target)
    # Handed over: the source answers MOVED, the client follows and learns the new owner.
    assert done_results(store, token, claims) == [DoneResult.OK] * 20
    assert redis_client.get_node_from_key(claims[0].key).name == target
    assert claim_results(store, store.new_token(), claims) == [DONE_HERE] * 20
