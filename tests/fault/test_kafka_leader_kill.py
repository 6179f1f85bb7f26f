"""The Kafka node leading a partition SIGKILLed mid-run and restarted: nothing guaranteed is
lost, nothing is handled twice (docs/design.md §10, invariants 1 and 2).

Two producer processes (delayed and persist-first) send while a consumer process handles, on
the cluster topology (three combined KRaft nodes, replication factor 3, ``min.insync.replicas``
2). The node leading partition 0 dies by SIGKILL. A combined node is a broker and a controller
voter at once, so the kill also takes out one of the three KRaft voters (possibly the active
controller, the quorum leader, which the other two then re-elect), the leadership of every
partition it led (of this topic, of ``__consumer_offsets``: possibly the consumer group's
coordinator) and one replica of every partition. The two surviving voters elect new leaders
from the in-sync replicas; the producers' unacknowledged records wait in librdkafka (or, in
delayed mode, go to the outbox) and the consumer resumes from its committed offsets. The node
then comes back, as a supervisor would restart it, and rejoins every partition's ISR.

When the dead node was the group's coordinator, librdkafka may find the static member fenced
once the group moved (a fatal error: ConsumerFencedError); the consumer process exits and the
test, as a process supervisor would, starts another, which resumes from the committed offsets.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from eoguard.stack import Endpoints, LocalStack
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.store.client import connect
from eoguard.store.keys import KeySpace
from tests.fault.consumer_fault_kit import Worker, effect_counts, unique_group
from tests.fault.producer_fault_kit import (
    ProducerWorker,
    read_topic,
    recover_concurrently,
    recovering_config,
)

pytestmark = [pytest.mark.fault, pytest.mark.cluster(only=True)]

PARTITIONS, RATE = 3, 150.0  # messages/s per producer: two producers on a two-core machine
MODES = ("delayed", "persist-first")


def test_the_partition_leader_sigkilled_and_restarted(stack: Endpoints, new_topic, key_prefix: str,
                                                      tmp_path: Path) -> None:
    topic, scope = new_topic(PARTITIONS), "leader"
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    leaders = _settled_leaders(admin, topic, PARTITIONS)
    victim_id = leaders[0]
    victim = _node(admin, victim_id)
    led = [p for p, leader in leaders.items() if leader == victim_id]
    group = unique_group("leader")
    consumer = Supervised(lambda: Worker(
        "consumer_worker.py", stack.kafka_bootstrap, stack.redis_url, topic, key_prefix, scope,
        group, log=tmp_path / "consumer.log"))
    stop_file = tmp_path / "stop"
    producers = {mode: ProducerWorker(tmp_path, bootstrap=stack.kafka_bootstrap,
                                      redis_url=stack.redis_url, prefix=key_prefix, topic=topic,
                                      mode=mode, rate=RATE,
                                      extra=["--shards", "16", "--until-file", str(stop_file)])
                 for mode in MODES}

    def guaranteed() -> int:
        return sum(len(p.guaranteed()) for p in producers.values())

    def holds(pred: Callable[[], bool]) -> bool:
        try:
            return pred()
        except KafkaException:  # a metadata request timed out while the cluster fails over
            return False

    def wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not holds(pred):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            consumer.watch()
            time.sleep(0.1)

    try:
        wait(lambda: guaranteed() >= 1_500, 60, "1500 guaranteed messages before the kill")
        victim.kill()  # SIGKILL
        killed_at, before = time.monotonic(), guaranteed()
        wait(lambda: victim_id not in _leaders(admin, topic).values(), 60,
              "new leaders for the partitions the dead node led")
        moved_s = time.monotonic() - killed_at
        wait(lambda: guaranteed() >= before + 1_000, 60, "1000 guarantees with the node down")
        down_s = time.monotonic() - killed_at
        victim.start()
        victim.detach()  # the stack's member again: the stack stops it
        wait(lambda: _in_every_isr(admin, topic, victim_id), 90, "the node back in every ISR")
        back_s = time.monotonic() - killed_at
        after = guaranteed()
        wait(lambda: guaranteed() >= after + 500, 60, "guarantees after the node came back")
    finally:
        if victim.pid() is None:
            victim.start()
            victim.detach()
        stop_file.touch()
        for worker in producers.values():
            worker.proc.wait(90)
            worker.log.close()
    # A producer keeps running in a deployment: its recovery resends whatever a closed one left
    # in the outbox (records librdkafka still held when it closed).
    recovery = dataclasses.replace(recovering_config(stack.kafka_bootstrap, stack.redis_url,
                                                     key_prefix), keyspace=KeySpace(prefix=key_prefix))
    [resent] = recover_concurrently([recovery])
    promised = {mode: set(worker.guaranteed()) for mode, worker in producers.items()}
    every = set().union(*promised.values())
    client = connect(stack.redis_url)
    keys = KeySpace(prefix=key_prefix)
    deadline = time.monotonic() + 120
    seen, counts = effect_counts(client, keys, scope)
    while not every <= seen and time.monotonic() < deadline:
        consumer.watch()
        time.sleep(1.0)
        seen, counts = effect_counts(client, keys, scope)
    time.sleep(2.0)  # a late second handling would show up now
    seen, counts = effect_counts(client, keys, scope)
    consumer.worker.stop()
    client.close()
    on_topic, _ = read_topic(stack.kafka_bootstrap, topic, expect_ids=every)
    lost = {mode: len(ids - seen) for mode, ids in promised.items()}
    twice = {i: n for i, n in counts.items() if n != 1}
    print(f"\nkilled node {victim_id} (leader of partitions {led} of {PARTITIONS}); new leaders "
          f"after {moved_s:.1f} s, down {down_s:.1f} s, back in every ISR {back_s:.1f} s after the "
          f"kill; guaranteed {', '.join(f'{m} {len(ids)}' for m, ids in promised.items())}; "
          f"recovery resent {resent}; records on the topic {sum(on_topic.values())} "
          f"({sum(1 for n in on_topic.values() if n > 1)} ids more than once); handled "
          f"{len(seen)} (consumer restarts {consumer.restarts}: {consumer.exits}); guaranteed not handled "
          f"{lost}; handled more than once {len(twice)}")
    assert all(len(ids) > 1_000 for ids in promised.values()), "a producer guaranteed too few"
    assert every <= seen, f"invariant 1 (no loss) broken: {lost}"
    assert set(counts) == seen
    assert twice == {}, f"invariant 2 (no duplicate) broken: {list(twice.items())[:5]}"


class Supervised:
    """The consumer worker, started again whenever it exits (as a process supervisor would)."""

    def __init__(self, start: Callable[[], Worker]) -> None:
        self.start, self.restarts, self.exits = start, 0, []
        self.worker = start()

    def watch(self) -> None:
        code = self.worker.proc.poll()
        if code is None:
            return
        self.worker.stop()  # reaps it
        self.exits.append(code)
        self.restarts += 1
        self.worker = self.start()


def _leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    """Partition -> id of its leader broker (-1 while it has none)."""
    meta = admin.list_topics(topic, timeout=10)
    return {p: part.leader for p, part in meta.topics[topic].partitions.items()}


def _settled_leaders(admin: AdminClient, topic: str, partitions: int) -> dict[int, int]:
    """:func:`_leaders` once every partition of a new topic has one (the three nodes learn of
    a new topic one after the other)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            leaders = _leaders(admin, topic)
        except (KafkaException, KeyError):
            leaders = {}
        if len(leaders) == partitions and min(leaders.values()) >= 0:
            return leaders
        assert time.monotonic() < deadline, f"topic {topic} has no leader for every partition"
        time.sleep(0.2)


def _in_every_isr(admin: AdminClient, topic: str, broker_id: int) -> bool:
    meta = admin.list_topics(topic, timeout=10)
    return all(broker_id in part.isrs for part in meta.topics[topic].partitions.values())


def _node(admin: AdminClient, broker_id: int) -> KafkaBroker:
    """The cluster stack's node behind ``broker_id`` (its port), which this test may SIGKILL."""
    port = admin.list_topics(timeout=10).brokers[broker_id].port
    cluster = LocalStack(topology="cluster").kafka
    node = next((n for n in getattr(cluster, "nodes", []) if n.port == port), None)
    where = f"broker {broker_id} (port {port}) is not a node of this machine's cluster stack"
    assert isinstance(node, KafkaBroker), where
    assert node.pid() is not None, where
    return node

