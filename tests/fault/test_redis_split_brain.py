"""A Redis Cluster master cut from its replica and the other masters while the clients still
reach it (split brain, tests/fault/chaos/split_brain.py), under outbox writes.

The majority promotes the replica; the cut master takes writes until it notices it lost the
majority, then refuses them (cluster state ``fail``), and on healing returns as its
successor's replica, dropping what it took meanwhile. With ``durability="replicated"`` none
of that was acknowledged (nothing acknowledged is lost), and the promoted replica, with no
replica of its own until the cut heals, takes no replicated write; with ``"local"`` only writes
acknowledged from just before the cut (what had not yet streamed to the replica) to twice the
node timeout after it may be lost: docs/design.md §4, Durability.
"""

from __future__ import annotations

import time

import pytest
from redis.cluster import RedisCluster

from eoguard.config import RedisConfig
from eoguard.stack import Endpoints
from eoguard.store.client import connect
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from eoguard.store.scripts import Scripts
from tests.fault.chaos.split_brain import SplitBrain
from tests.fault.test_redis_failover import BATCH, Writer, _master_of, _wait

pytestmark = [pytest.mark.fault, pytest.mark.cluster(only=True)]

NODE_TIMEOUT_S = 2.0  # the local cluster's cluster-node-timeout
BEFORE_S = 1.0  # acknowledged this long before the cut, maybe not yet on the replica
AFTER_S = 2 * NODE_TIMEOUT_S + 1.0  # the cut master notices it lost the majority by then
HOLD_S = 3.0  # cut this long after the replica took over
# Past the test's end, and short: an outbox record's slot is its shard's for every key prefix,
# so the ~60,000 records written here would otherwise slow the chaos resharding of the
# cluster for an hour (thousands of keys to move per slot, a few at a time).
TTL_MS = 120_000


@pytest.mark.parametrize("durability", ["replicated", "local"])
def test_a_master_cut_off_loses_nothing_acknowledged_beyond_the_bound(
        durability: str, stack: Endpoints, key_prefix: str) -> None:
    config = RedisConfig(url=stack.redis_url, durability=durability, socket_timeout_s=1.0,
                         connect_timeout_s=0.5)
    client = config.connect()
    assert isinstance(client, RedisCluster)
    keys = KeySpace(prefix=key_prefix, shards=16)
    writer = Writer(Outbox(client, keys, scripts=Scripts(client, wait=config.replica_wait())),
                    ttl_ms=TTL_MS)
    victim = _master_of(client, keys.outbox_index(0))
    _wait(victim.cluster_ready, 60, "every master with a replica in sync")
    brain = SplitBrain(victim.port)
    writer.start()
    try:
        _wait(lambda: len(writer.acked) >= 3_000, 60, "3000 acknowledged writes")
        brain.cut()
        cut_at = time.monotonic()
        _wait(victim.replaced, 30, "the replica to take over")
        took_over_s = time.monotonic() - cut_at
        time.sleep(HOLD_S)  # replicated: the promoted replica has no replica, writes fail
        brain.heal()
        _wait(victim.cluster_ready, 60, "the cut master back as its successor's replica")
        before = len(writer.acked)
        _wait(lambda: len(writer.acked) >= before + 20 * BATCH, 60, "writes after healing")
    finally:
        writer.stop.set()
        writer.join(30)
        brain.heal()
    client.close()
    fresh = connect(stack.redis_url)
    present = Outbox(fresh, keys).expire_times(writer.acked)
    fresh.close()
    lost_at = sorted({round(writer.acked_at[i // BATCH] - cut_at, 2)
                      for i, m in enumerate(writer.acked) if present[m] < 0})
    lost = sum(1 for m in writer.acked if present[m] < 0)
    print(f"\ndurability={durability}: {len(writer.acked)} writes acknowledged, {writer.failed} "
          f"round trips failed; replica took over after {took_over_s:.1f} s, healed {HOLD_S:.0f} s "
          f"later; {lost} acknowledged writes lost, acknowledged at {lost_at[:3]}..{lost_at[-3:]} "
          f"s from the cut")
    if durability == "replicated":
        assert lost == 0
    else:
        assert all(-BEFORE_S <= t <= AFTER_S for t in lost_at), lost_at
