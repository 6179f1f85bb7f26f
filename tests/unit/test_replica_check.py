"""The replicated start check's reading of a Redis Cluster's state (eoguard.store.replicas),
over views of CLUSTER NODES as nodes give them during a failover. Pure logic: a stand-in for
the cluster client answers INFO, CLUSTER NODES and CLUSTER MYID; the real failover is
tests/fault/test_redis_failover.py."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

import pytest
from redis.cluster import RedisCluster

from eoguard.errors import ConfigError, FailoverUnderWayError
from eoguard.store.replicas import check_replicas

OLD, NEW, OTHER, OTHER_REPLICA = "a" * 40, "b" * 40, "c" * 40, "d" * 40


def node(node_id: str, flags: str, master_id: str, slots: list[Any]) -> dict[str, Any]:
    return {"node_id": node_id, "flags": flags, "master_id": master_id,
            "last_pong_rcvd": str(int(time.time() * 1000) - 2_000), "slots": slots}


def cluster(view: dict[str, dict[str, Any]]) -> Any:
    """A cluster client whose masters are 17006 (the promoted replica, alone) and 17002 (with
    its replica), and whose CLUSTER NODES answers ``view``."""
    client = mock.create_autospec(RedisCluster, instance=True)
    client.info.return_value = {"127.0.0.1:17006": {"connected_slaves": 0},
                                "127.0.0.1:17002": {"connected_slaves": 1}}
    client.cluster_nodes.return_value = view
    client.get_primaries.return_value = []
    client.get_node.side_effect = lambda node_name: node_name
    client.execute_command.side_effect = lambda *_args, target_nodes: {
        "127.0.0.1:17006": NEW, "127.0.0.1:17002": OTHER}[target_nodes].encode()
    return client


OTHERS = {"127.0.0.1:17002": node(OTHER, "master", "-", [["5461", "10922"]]),
          "127.0.0.1:17005": node(OTHER_REPLICA, "slave", OTHER, [])}


@pytest.mark.parametrize("lagging", [False, True])
def test_a_promoted_replica_alone_while_its_old_master_is_down_is_a_failover(
        lagging: bool) -> None:
    """The node answering CLUSTER NODES may have seen the promotion (the old master failed,
    slotless) or not yet (the old master failed with its slots, the promoted node still its
    replica): either way the shortage is a failover under way, to retry."""
    if lagging:
        shard = {"127.0.0.1:17001": node(OLD, "master,fail", "-", [["0", "5460"]]),
                 "127.0.0.1:17006": node(NEW, "slave", OLD, [])}
    else:
        shard = {"127.0.0.1:17001": node(OLD, "master,fail", "-", []),
                 "127.0.0.1:17006": node(NEW, "master", "-", [["0", "5460"]])}
    with pytest.raises(FailoverUnderWayError, match=r"127\.0\.0\.1:17001 is failing") as caught:
        check_replicas(cluster({**shard, **OTHERS}), 1)
    print(f"lagging={lagging}: {caught.value}")


def test_a_master_without_a_replica_and_no_failure_is_a_config_error() -> None:
    """No failing node of its shard, no replica known: retrying cannot help."""
    shard = {"127.0.0.1:17006": node(NEW, "master", "-", [["0", "5460"]])}
    with pytest.raises(ConfigError, match="add a replica"):
        check_replicas(cluster({**shard, **OTHERS}), 1)


def test_a_failed_node_of_another_shard_explains_nothing() -> None:
    """Another shard's failing replica does not explain this master's shortage."""
    shard = {"127.0.0.1:17006": node(NEW, "master", "-", [["0", "5460"]])}
    others = {**OTHERS, "127.0.0.1:17005": node(OTHER_REPLICA, "slave,fail", OTHER, [])}
    with pytest.raises(ConfigError, match="add a replica"):
        check_replicas(cluster({**shard, **others}), 1)


def test_a_replaced_master_back_without_slots_is_a_failover_not_a_config_error() -> None:
    """Found by the chaos suite (cluster seed 4: a master killed and restarted, then a consumer
    started): the promoted replica has no replica yet, and its old master is back, up, a
    master without slots until the cluster makes it a replica. A consumer starting then
    crashed with ConfigError; the shortage passes: FailoverUnderWayError, a retry."""
    shard = {"127.0.0.1:17001": node(OLD, "master", "-", []),
             "127.0.0.1:17006": node(NEW, "master", "-", [["0", "5460"]])}
    with pytest.raises(FailoverUnderWayError, match=r"127\.0\.0\.1:17001 is a master without "):
        check_replicas(cluster({**shard, **OTHERS}), 1)


def test_a_master_a_failover_turned_replica_is_a_failover_not_a_config_error() -> None:
    """Chaos cluster seed 4 again (a master paused past the node timeout and replaced, then a
    consumer started): the client's slot map, read from a node that had not seen the failover,
    named the old master a primary; it is a replica now (INFO: no replicas of its own). A
    failover under way, not a deployment without replicas."""
    shard = {"127.0.0.1:17006": node(NEW, "slave", OLD, []),  # 17006 is the one asked: NEW
             "127.0.0.1:17001": node(OLD, "master", "-", [["0", "5460"]])}
    with pytest.raises(FailoverUnderWayError, match=r"127\.0\.0\.1:17006 is a replica now"):
        check_replicas(cluster({**shard, **OTHERS}), 1)
