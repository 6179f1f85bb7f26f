"""The services' faults on each topology: SIGKILL and restart, SIGSTOP and SIGCONT, OOM.

``SingleNode`` strikes a private broker and a private Redis (AOF, ``appendfsync always``);
``Cluster`` strikes the members of the cluster topology's three Kafka nodes and six Redis
nodes, found through their pid files, and reshards the Redis Cluster under the run
(reshard.py), and waits after each fault until the cluster is whole again (every partition
led, every master with a replica in sync) before the next one. What a fault finds wrong
itself (a key on both sides of a moving slot) goes to ``violations``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

import redis
from confluent_kafka.admin import AdminClient

from eoguard.stack.kafka_broker import KafkaBroker, broker_answers
from eoguard.stack.kafka_cluster import KafkaCluster
from eoguard.stack.process import ManagedProcess
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer
from tests.fault.chaos.reshard import REDIRECTS, reshard
from tests.fault.chaos.split_brain import SplitBrain

FaultFn = Callable[[random.Random, float], str]


def pause(node: ManagedProcess, hold_s: float) -> None:
    """SIGSTOP the node's process group for ``hold_s``, then SIGCONT it."""
    pid = node.pid()
    assert pid is not None, f"{node.name} in {node.workdir} is not running"
    os.killpg(pid, signal.SIGSTOP)
    try:
        time.sleep(hold_s)
    finally:
        os.killpg(pid, signal.SIGCONT)


def restart(node: ManagedProcess) -> None:
    """Start a killed member again and leave it running past this object (its stack stops it)."""
    node.start()
    node.detach()


def out_of_memory(nodes: list[RedisServer], hold_s: float) -> str:
    """``maxmemory`` just above what each node uses, ``noeviction``: writes fail with OOM."""
    clients = [node.client(timeout_s=2.0) for node in nodes]
    try:
        for client in clients:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", str(used + 64 * 1024))
        time.sleep(hold_s)
    finally:
        for client in clients:
            client.config_set("maxmemory", "0")
            client.close()
    return f"maxmemory reached on {len(nodes)} node(s) for {hold_s:.0f} s"


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``pred()`` held; AssertionError naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    while not pred():
        assert time.monotonic() - started < timeout_s, f"timed out after {timeout_s:.0f} s: {what}"
        time.sleep(0.2)
    return time.monotonic() - started


class SingleNode:
    """Faults of one broker and one Redis."""

    def __init__(self, kafka: KafkaBroker, redis_server: RedisServer) -> None:
        self.kafka, self.redis = kafka, redis_server
        self.violations: list[str] = []
        self.faults: dict[str, FaultFn] = {
            "kafka-kill": self.kill_kafka, "kafka-pause": self.pause_kafka,
            "redis-kill-aof": self.kill_redis, "redis-pause": self.pause_redis,
            "redis-oom": lambda _rng, hold: out_of_memory([self.redis], hold),
        }

    def kill_kafka(self, _rng: random.Random, hold_s: float) -> str:
        self.kafka.kill()
        time.sleep(hold_s)
        self.kafka.start()
        return "broker SIGKILLed and restarted"

    def pause_kafka(self, _rng: random.Random, hold_s: float) -> str:
        pause(self.kafka, hold_s)
        return f"broker paused {hold_s:.0f} s"

    def kill_redis(self, _rng: random.Random, hold_s: float) -> str:
        self.redis.kill()
        time.sleep(hold_s)
        self.redis.start()
        return "Redis SIGKILLed, restarted from its AOF"

    def pause_redis(self, _rng: random.Random, hold_s: float) -> str:
        pause(self.redis, hold_s)
        return f"Redis paused {hold_s:.0f} s"

    def healthy(self) -> None:
        wait_until(lambda: broker_answers(self.kafka.address) and self.redis.is_ready(), 90,
                   "the broker and Redis answering")


class Cluster:
    """Faults of the three Kafka nodes and the Redis Cluster's six nodes."""

    def __init__(self, kafka: KafkaCluster, redis_nodes: RedisClusterNodes, topic: str,
                 redis_url: str, slots: dict[int, str], *, reshard_weight: float = 1.0) -> None:
        self.kafka, self.redis, self.topic = kafka, redis_nodes, topic
        self.redis_url, self.slots = redis_url, slots  # the run's hash slots (reshard.run_slots)
        self.reshard_weight = reshard_weight  # the fourth master's share (reshard.reshard)
        self.violations: list[str] = []
        self.faults: dict[str, FaultFn] = {
            "kafka-leader-kill": self.kill_leader, "kafka-restart-all": self.restart_kafka,
            "kafka-pause": self.pause_broker, "redis-master-kill": self.kill_master,
            "redis-master-pause-failover": self.pause_master, "redis-pause": self.pause_replica,
            "redis-oom": lambda _rng, hold: out_of_memory(self._by_role("master"), hold),
            "redis-reshard": self.reshard, "redis-split-brain": self.split_brain,
        }

    def brokers(self) -> list[KafkaBroker]:
        return [node for node in self.kafka.nodes if isinstance(node, KafkaBroker)]

    def _by_role(self, role: str) -> list[RedisServer]:
        out = []
        for node in self.redis.servers:
            client = node.client(timeout_s=1.0)
            try:
                if client.info("replication").get("role") == role:
                    out.append(node)
            except redis.RedisError:
                pass
            finally:
                client.close()
        return out

    def kill_leader(self, rng: random.Random, hold_s: float) -> str:
        """SIGKILL the broker leading a random partition of the topic, restart it."""
        admin = AdminClient({"bootstrap.servers": self.kafka.address})
        partitions = admin.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        partition = rng.choice(sorted(partitions))
        leader = partitions[partition].leader
        node = self.brokers()[leader - 1]
        node.kill()
        time.sleep(hold_s)
        restart(node)
        return f"leader {leader} of partition {partition} SIGKILLed and restarted"

    def restart_kafka(self, _rng: random.Random, hold_s: float) -> str:
        """SIGKILL all three nodes, then start them together."""
        for node in self.brokers():
            node.kill()
        time.sleep(hold_s)
        self.kafka.start()
        for node in self.brokers():
            node.detach()
        return "all three Kafka nodes SIGKILLed and restarted"

    def pause_broker(self, rng: random.Random, hold_s: float) -> str:
        node = rng.choice(self.brokers())
        pause(node, hold_s)
        return f"broker on {node.port} paused {hold_s:.0f} s"

    def kill_master(self, rng: random.Random, hold_s: float) -> str:
        """SIGKILL a master; once its replica took over, the old master returns as a replica."""
        node = rng.choice(self._by_role("master"))
        replica = self._replica_of(node)
        node.kill()
        took = wait_until(lambda: self._promoted(replica), 60, "a replica to take over")
        time.sleep(hold_s)
        restart(node)
        return f"master on {node.port} SIGKILLed, replaced after {took:.1f} s"

    def pause_master(self, rng: random.Random, hold_s: float) -> str:
        """SIGSTOP a master past the cluster node timeout: its replica takes over meanwhile."""
        node = rng.choice(self._by_role("master"))
        pause(node, hold_s)
        return f"master on {node.port} paused {hold_s:.0f} s (past the 2 s node timeout)"

    def pause_replica(self, rng: random.Random, hold_s: float) -> str:
        """SIGSTOP a replica: replicated writes to its master wait in vain meanwhile."""
        node = rng.choice(self._by_role("slave"))
        pause(node, hold_s)
        return f"replica on {node.port} paused {hold_s:.0f} s"

    def split_brain(self, rng: random.Random, hold_s: float) -> str:
        """Cut a master from its replica and the other masters, clients still reaching it
        (split_brain.py); once its replica took over, hold, then heal."""
        master = rng.choice(self._by_role("master"))
        replica = self._replica_of(master)
        brain = SplitBrain(master.port)
        try:
            brain.cut()
            took = wait_until(lambda: self._promoted(replica), 60, "the replica to take over")
            time.sleep(hold_s)
        finally:
            brain.heal()
        return (f"master on {master.port} cut from its replica and the other masters, clients "
                f"still reaching it; its replica took over after {took:.1f} s, healed "
                f"{hold_s:.0f} s later")

    def reshard(self, rng: random.Random, hold_s: float) -> str:
        """A fourth master joins, the run's slots move slowly through it and between the
        others, it leaves (reshard.py)."""
        found = reshard(self.redis, self.redis_url, self.slots, rng, hold_s,
                        weight=self.reshard_weight)
        self.violations += found.violations
        slow = found.moved
        met = ", ".join(f"{kind} {found.redirects[kind]}" for kind in REDIRECTS)
        return (f"{len(slow)} of the run's slots moved a few keys at a time "
                f"({sum(m.keys for m in slow)} keys, half-moved "
                f"{min(m.half_moved_s for m in slow):.1f}-{max(m.half_moved_s for m in slow):.1f} s"
                f" each), a fourth master joined, was rebalanced in and left; replies meanwhile: "
                f"{met}:\n"
                + "\n".join(f"           {step}" for step in found.steps))

    def _replica_of(self, master: RedisServer) -> RedisServer:
        for node in self._by_role("slave"):
            client = node.client(timeout_s=1.0)
            try:
                if int(client.info("replication").get("master_port", 0)) == master.port:
                    return node
            finally:
                client.close()
        raise AssertionError(f"the master on {master.port} has no replica")

    def _promoted(self, node: RedisServer) -> bool:
        client = node.client(timeout_s=1.0)
        try:
            return client.info("replication").get("role") == "master"
        except redis.RedisError:
            return False
        finally:
            client.close()

    def healthy(self) -> None:
        """Every Kafka node answers, every slot served, every master with a replica in sync."""
        wait_until(lambda: self.kafka.is_ready() and self.redis.is_ready(), 120,
                   "the cluster whole again")
