"""A Redis Cluster master SIGKILLed while the outbox is written: its replica takes over.

With ``durability="replicated"`` every write acknowledged (the round trip that would fire
``on_guaranteed``) is on the promoted replica; with ``"local"`` the writes the master
acknowledged but had not yet streamed to its replica are lost: counted and printed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from redis.cluster import RedisCluster

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.errors import BackpressureError, FailoverUnderWayError, StoreError
from eoguard.modes import KeepUntil
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import Endpoints
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer
from eoguard.store.client import connect
from eoguard.store.keys import KeySpace
from eoguard.store.layout import check_layout
from eoguard.store.outbox import Outbox
from eoguard.store.scripts import Scripts
from tests.consumer_kit import consumer_config
from tests.fault.consumer_fault_kit import effect_counts
from tests.integration.test_outbox_store import HOUR_MS, record

pytestmark = [pytest.mark.fault, pytest.mark.cluster(only=True)]

BATCH = 50


class Writer(threading.Thread):
    """Writes outbox batches until stopped; keeps the ids of every acknowledged batch and when
    each batch was acknowledged (``acked_at[i]``, monotonic: batch ``i`` is
    ``acked[i * BATCH:(i + 1) * BATCH]``)."""

    def __init__(self, outbox: Outbox, ttl_ms: int = HOUR_MS) -> None:
        super().__init__(daemon=True)
        self.outbox, self.acked, self.failed, self.ttl_ms = outbox, [], 0, ttl_ms
        self.acked_at: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            recs = [record(key=b"k%d" % i, ttl_ms=self.ttl_ms) for i in range(BATCH)]
            try:
                self.outbox.put(recs, owner="p1", keep_until=KeepUntil.CONSUMED,
                                resend_after_ms=600_000)
            except StoreError:
                self.failed += 1
                time.sleep(0.05)
                continue
            self.acked.extend(r.id for r in recs)
            self.acked_at.append(time.monotonic())


@pytest.mark.parametrize("durability", ["replicated", "local"])
def test_a_master_sigkilled_mid_write(durability: str, stack: Endpoints, key_prefix: str) -> None:
    config = RedisConfig(url=stack.redis_url, durability=durability, socket_timeout_s=1.0,
                         connect_timeout_s=0.5)
    client = config.connect()
    assert isinstance(client, RedisCluster)
    keys = KeySpace(prefix=key_prefix, shards=16)
    outbox = Outbox(client, keys, scripts=Scripts(client, wait=config.replica_wait()))
    writer = Writer(outbox)
    writer.start()
    victim = _master_of(client, keys.outbox_index(0))
    _wait(victim.cluster_ready, 60, "every master with a replica in sync")
    try:
        _wait(lambda: len(writer.acked) >= 3_000, 60, "3000 acknowledged writes")
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        before = len(writer.acked)
        _wait(victim.replaced, 30, "a replica to take over")
        took_over_s = time.monotonic() - killed_at
        # As a supervisor would: the dead master comes back, as its successor's replica; until
        # then replicated writes to the successor's slots wait in vain (no replica left).
        victim.restart()
        _wait(lambda: len(writer.acked) >= before + 20 * BATCH, 60, "writes after the failover")
        resumed_s = time.monotonic() - killed_at
    finally:
        writer.stop.set()
        writer.join(30)
        if not victim.pid_alive():
            victim.restart()
    client.close()
    fresh = connect(stack.redis_url)
    present = Outbox(fresh, keys).expire_times(writer.acked)
    lost = [i for i in writer.acked if present[i] < 0]
    fresh.close()
    print(f"\ndurability={durability}: {len(writer.acked)} writes acknowledged, "
          f"{writer.failed} round trips failed; replica took over after {took_over_s:.1f} s, "
          f"writes resumed after {resumed_s:.1f} s; {len(lost)} acknowledged writes lost")
    _wait(victim.cluster_ready, 60, "the cluster with every master replicated again")
    if durability == "replicated":
        assert lost == []


@pytest.mark.parametrize("durability", ["replicated", "local"])
def test_guaranteed_messages_are_handled_once_across_a_master_failover(
        durability: str, stack: Endpoints, key_prefix: str, new_topic) -> None:
    """Producer and consumer while a master dies and comes back: with replicated durability
    every message guaranteed is handled exactly once in the scope (Redis-side effects); with
    local durability the misses and repeats are counted."""
    topic, dlq = new_topic(4), new_topic(1, prefix="dlq")
    redis_config = RedisConfig(url=stack.redis_url, durability=durability,
                               socket_timeout_s=1.0, connect_timeout_s=0.5)
    keys = KeySpace(prefix=key_prefix, shards=16)
    guaranteed: set[str] = set()
    lock = threading.Lock()

    def on_guaranteed(handle) -> None:
        with lock:
            guaranteed.add(handle.id)

    def handler(ctx: HandlerContext) -> None:
        ctx.tx.sadd(ctx.key_for("seen"), ctx.message_id)
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))

    config = dataclasses.replace(
        consumer_config(stack.kafka_bootstrap, stack.redis_url, [topic], prefix=key_prefix,
                        scope="fo", dead_letter_topic=dlq), redis=redis_config)
    consumer = GuardedConsumer(config, handler=handler)
    stop = threading.Event()
    runner = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    runner.start()
    producer = GuardedProducer(ProducerConfig(
        kafka={"bootstrap.servers": stack.kafka_bootstrap, "linger.ms": 5}, redis=redis_config,
        keyspace=keys, default_ttl_s=600, send_timeout_s=2.0), on_guaranteed=on_guaranteed)
    client = connect(stack.redis_url)
    victim = _master_of(client, keys.outbox_index(0))
    _wait(victim.cluster_ready, 60, "every master with a replica in sync")
    sent = 0

    def send_until(pred, timeout_s: float, what: str) -> None:
        nonlocal sent
        deadline = time.monotonic() + timeout_s
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for _ in range(20):
                try:
                    producer.send(topic, b"m%d" % sent)
                    sent += 1
                except BackpressureError:  # the queue full while Redis is down: the app holds it
                    pass
            time.sleep(0.02)

    try:
        send_until(lambda: len(guaranteed) >= 1_500, 60, "1500 guaranteed messages")
        os.kill(victim.pid, signal.SIGKILL)
        send_until(victim.replaced, 30, "a replica to take over")
        victim.restart()
        before = len(guaranteed)
        send_until(lambda: len(guaranteed) >= before + 1_000, 90, "guarantees after the failover")
        producer.flush(30)
    finally:
        producer.close()
        if not victim.pid_alive():
            victim.restart()
    with lock:
        promised = set(guaranteed)
    deadline = time.monotonic() + (120 if durability == "replicated" else 30)
    while True:
        seen, counts = effect_counts(client, keys, "fo")
        if promised <= seen or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    stop.set()
    runner.join(60)
    client.close()
    twice = {i: n for i, n in counts.items() if n != 1}
    print(f"\n{durability}: {sent} sent, {len(promised)} guaranteed across the failover, "
          f"{len(promised - seen)} of them not handled, {len(twice)} handled more than once")
    _wait(victim.cluster_ready, 60, "the cluster with every master replicated again")
    if durability == "replicated":
        assert promised <= seen
        assert not twice


def test_a_replicated_start_during_a_failover_is_a_retry_not_a_config_error(
        stack: Endpoints, key_prefix: str) -> None:
    """A consumer or producer started while a promoted replica has no replica of its own (its
    old master still down) gets FailoverUnderWayError, which a supervisor retries; once the old
    master is back as its replica, the same start check passes."""
    keys = KeySpace(prefix=key_prefix)
    client = connect(stack.redis_url)
    victim = _master_of(client, keys.outbox_index(0))
    client.close()
    _wait(victim.cluster_ready, 60, "every master with a replica in sync")
    check_layout(connect(stack.redis_url), keys, replicas=1)
    os.kill(victim.pid, signal.SIGKILL)
    try:
        _wait(victim.replaced, 30, "a replica to take over")
        fresh = connect(_seeded_at(stack.redis_url, victim.others[0]))  # the URL may name the victim
        with pytest.raises(FailoverUnderWayError, match="a failover is under way") as caught:
            check_layout(fresh, keys, replicas=1)
        fresh.close()
        print(f"\nkilled {victim.port}, asked {victim.others[0]}: {caught.value}")
        assert f":{victim.port}" in str(caught.value)  # names the failing node
    finally:
        victim.restart()
    _wait(victim.cluster_ready, 60, "the cluster with every master replicated again")
    fresh = connect(stack.redis_url)
    check_layout(fresh, keys, replicas=1)
    fresh.close()


class Victim:
    """The master to SIGKILL: its pid, and how to start it again from its own config."""

    def __init__(self, host: str, port: int) -> None:
        client = redis.Redis(host=host, port=port)
        info = client.info("server")
        self.node_id = client.execute_command("CLUSTER MYID").decode()
        client.close()
        self.pid, self.port = int(info["process_id"]), port
        self.workdir = Path(info["config_file"]).parent
        self.others = [p for p in _ports(port) if p != port]

    def pid_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def restart(self) -> None:
        server = RedisServer(self.workdir, port=self.port, cluster_node_timeout_ms=2000)
        server.kill()  # forgets the pid file of the dead process
        server.start()
        server.detach()  # the stack's member again: the stack stops it
        self.pid = server.pid() or 0

    def replaced(self) -> bool:
        """A surviving node sees the victim failed and its slots served by another master."""
        return any(self._view(port) for port in self.others)

    def cluster_ready(self) -> bool:
        """The stack's own readiness: all slots served, every master with a replica in sync."""
        return RedisClusterNodes(self.workdir.parent, port=min(_ports(self.port))).is_ready()

    def _view(self, port: int) -> bool:
        me = _nodes(port).get(self.node_id)
        return me is not None and "fail" in me["flags"] and not me["slots"]


def _ports(seed: int) -> list[int]:
    return sorted({int(n["port"]) for n in _nodes(seed).values()} | {seed}) if _nodes(seed) else [seed]


def _seeded_at(url: str, port: int) -> str:
    """``url`` with its node replaced by the live node at ``port``: a cluster client's first
    question goes to the node its URL names, and a dead one answers nothing."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{port}"))


def _nodes(port: int) -> dict[str, dict[str, str]]:
    """CLUSTER NODES as one node sees it: node id -> flags, slots, port ({} when it is down)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5,
                         socket_timeout=0.5)
    try:
        parsed = client.execute_command("CLUSTER NODES")  # redis-py: {"host:port": {...}}
    except redis.RedisError:
        return {}
    finally:
        client.close()
    out = {}
    for address, node in parsed.items():
        out[node["node_id"]] = {"flags": node["flags"], "slots": node["slots"],
                                "port": address.rsplit(":", 1)[1]}
    return out


def _master_of(client: RedisCluster, key: str) -> Victim:
    node = client.get_node_from_key(key)
    return Victim(node.host, node.port)


def _wait(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
