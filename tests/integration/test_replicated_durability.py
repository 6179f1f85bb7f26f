"""durability="replicated": WAIT after each round trip of writes; refused without replicas; a
replica that does not answer in time is ReplicationTimeoutError, never a guarantee."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from eoguard.config import RedisConfig
from eoguard.errors import ConfigError, ReplicationTimeoutError
from eoguard.modes import KeepUntil
from eoguard.stack import Endpoints
from eoguard.stack.redis_server import RedisServer
from eoguard.store.dedup import DedupStore
from eoguard.store.keys import KeySpace
from eoguard.store.layout import check_layout
from eoguard.store.outbox import Outbox
from eoguard.store.replicas import ReplicaWait
from eoguard.store.scripts import Scripts
from tests.conftest import free_port
from tests.dedup_kit import NEW, claim_of
from tests.integration.test_outbox_store import record

pytestmark = pytest.mark.integration


def replicated_outbox(client, key_prefix: str, timeout_s: float = 1.0) -> Outbox:
    wait = RedisConfig(url="redis://unused:1/0", durability="replicated",
                       replica_timeout_s=timeout_s).replica_wait()
    return Outbox(client, KeySpace(prefix=key_prefix, shards=8), scripts=Scripts(client, wait=wait))


def test_a_redis_without_replica_is_refused_and_never_acknowledged(redis_client,
                                                                   key_prefix) -> None:
    keys = KeySpace(prefix=key_prefix)
    with pytest.raises(ConfigError, match="needs 1 replica"):
        check_layout(redis_client, keys, replicas=1)
    outbox = replicated_outbox(redis_client, key_prefix, timeout_s=0.05)
    with pytest.raises(ReplicationTimeoutError, match="0 of 1 replicas"):
        outbox.put([record()], owner="p1", keep_until=KeepUntil.CONSUMED, resend_after_ms=60_000)


@pytest.mark.cluster(only=True)
def test_writes_wait_for_a_replica_of_each_master_they_touch(redis_client, key_prefix) -> None:
    check_layout(redis_client, KeySpace(prefix=key_prefix), replicas=1)
    outbox = replicated_outbox(redis_client, key_prefix)
    recs = [record(key=b"k%d" % i) for i in range(200)]  # 8 shards over the 3 masters
    result = outbox.put(recs, owner="p1", keep_until=KeepUntil.CONSUMED, resend_after_ms=60_000)
    assert sorted(result.stored) == sorted(r.id for r in recs)
    for rec in recs[::20]:  # on the replica of its master
        node = redis_client.get_node_from_key(outbox.keys.outbox_record(rec.id))
        replica = _replica_of(node.name)
        assert replica.execute_command("READONLY")
        assert replica.exists(outbox.keys.outbox_record(rec.id)) == 1
        replica.close()


@pytest.mark.cluster(only=True)
def test_a_replica_that_does_not_answer_in_time_is_a_typed_error(stack: Endpoints, redis_client,
                                                                 key_prefix) -> None:
    outbox = replicated_outbox(redis_client, key_prefix, timeout_s=0.2)
    rec = record()
    master = redis_client.get_node_from_key(outbox.keys.outbox_record(rec.id))
    replica = _replica_of(master.name)
    pid = int(replica.info("server")["process_id"])
    replica.close()
    os.kill(pid, signal.SIGSTOP)  # the stack's own replica; continued below, whatever happens
    try:
        with pytest.raises(ReplicationTimeoutError, match="0 of 1 replicas"):
            outbox.put([rec], owner="p1", keep_until=KeepUntil.CONSUMED, resend_after_ms=60_000)
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10  # the replica catches up: the same write now passes
    while True:
        try:
            outbox.put([rec], owner="p1", keep_until=KeepUntil.CONSUMED, resend_after_ms=60_000)
            break
        except ReplicationTimeoutError:
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.1)


def _replica_of(master: str) -> redis.Redis:
    """A client of the replica of the master named ``master`` (host:port)."""
    host, port = master.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port))
    info = client.info("replication")
    client.close()
    return redis.Redis(host=info["slave0"]["ip"], port=int(info["slave0"]["port"]))


def test_calls_in_flight_wait_on_their_own_connection(private_redis, tmp_path) -> None:
    # A single node with a replica: the consumer's round trips sent ahead (InFlight) end with
    # WAIT on the connection that carried them, read with their replies.
    replica = RedisServer(tmp_path / "replica", port=free_port())
    replica.start()
    client = redis.Redis.from_url(private_redis.address)
    try:
        link = replica.client(timeout_s=2.0)
        link.replicaof("127.0.0.1", private_redis.port)
        deadline = time.monotonic() + 15
        while link.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        link.close()
        store = DedupStore(client, scope="app", keys=KeySpace(prefix="inflight"),
                           wait=ReplicaWait(replicas=1, timeout_ms=2000))
        token = store.new_token()
        claims = [claim_of(store, f"w-{i}", i) for i in range(10)]
        [report] = store.send([store.prepare_claim(token, claims)]).wait()
        assert [o.result for o in report.outcomes(claims)] == [NEW] * 10
        on_replica = replica.client(timeout_s=2.0)
        assert on_replica.exists(*(c.key for c in claims)) == 10  # WAIT said so: it is there
        on_replica.close()
        os.kill(replica.pid() or 0, signal.SIGSTOP)  # no acknowledgement in time now
        store_fast = DedupStore(client, scope="app", keys=KeySpace(prefix="inflight"),
                                wait=ReplicaWait(replicas=1, timeout_ms=100))
        flight = store_fast.send([store_fast.prepare_done(token, claims)])
        with pytest.raises(ReplicationTimeoutError, match="0 of 1 replicas"):
            flight.wait()
        assert client.ping()  # the connection's replies were all read: the pool is clean
    finally:
        os.kill(replica.pid() or 0, signal.SIGCONT)
        client.close()
        replica.stop()
