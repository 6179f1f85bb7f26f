"""Chaos: producer, consumer, Kafka and Redis all SIGKILLed at random points, then §10 checked.

A private Kafka and a private Redis (AOF, appendfsync always) carry one topic. Producers and
a consumer run as subprocesses (``eoguard.demo.worker``); a chaos loop kills one of the four
every second or two and restarts it. Expired envelopes and malformed records are injected
straight into the topic. Then every invariant of docs/design.md §10 is checked and its counts
printed; invariant 5 waits out the TTL plus grace and scans what is left in Redis.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import pytest
import redis

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.demo import observe
from eoguard.demo.inject import inject
from eoguard.demo.procs import Worker, spawn
from eoguard.envelope import now_ms
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import create_topics
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.redis_server import RedisServer
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from eoguard.store.outbox_admin import sweep_index

pytestmark = [pytest.mark.fault, pytest.mark.integration]

MESSAGES = 3000
RATE = 150.0  # messages/s per producer: sending spans the whole chaos phase
TTL_S = float(os.environ.get("EOGUARD_CHAOS_TTL_S", "90"))
GRACE_S = 3.0
KILLS_EACH = 2  # SIGKILLs of each of the four processes per run
EXPIRED = 25


class Ledgers:
    """What the producers wrote: sent ids by sequence number, guaranteed ids."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def read(self) -> tuple[dict[int, str], set[str]]:
        sent: dict[int, str] = {}
        guaranteed: set[str] = set()
        for path in self.folder.glob("*.ledger"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if parts[:1] == ["S"] and len(parts) == 3:
                    sent[int(parts[1])] = parts[2]
                elif parts[:1] == ["G"] and len(parts) == 2:
                    guaranteed.add(parts[1])
        return sent, guaranteed


def _message_created_ms(message_id: str) -> int:
    """A UUIDv7's first 48 bits are its creation time in ms."""
    return int(message_id.replace("-", "")[:12], 16)


def test_every_process_killed_at_random_keeps_section_10(
    private_kafka: KafkaBroker, private_redis: RedisServer, tmp_path: Path
) -> None:
    seed = int(os.environ.get("EOGUARD_CHAOS_SEED", str(random.SystemRandom().randrange(10**6))))
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]
    topic, dlq, scope, prefix = f"chaos-{run}", f"chaos-{run}.dlq", "chaos", f"chaos{run}"
    keys = KeySpace(prefix=prefix)
    create_topics(private_kafka.address, {topic: 4, dlq: 1})
    injected = inject(private_kafka.address, topic, expired=EXPIRED)
    ledgers = Ledgers(tmp_path)
    common = ["--bootstrap", private_kafka.address, "--redis-url", private_redis.address,
              "--prefix", prefix, "--topic", topic]
    workers: list[Worker] = []

    def producer(start: int, count: int) -> Worker:
        name = f"p{len(workers)}"
        worker = spawn(name, ["-m", "eoguard.demo.worker", "producer", *common,
                              "--stats", str(tmp_path / f"{name}.json"), "--name", name,
                              "--ledger", str(tmp_path / f"{name}.ledger"), "--start", str(start),
                              "--count", str(count), "--rate", str(RATE), "--ttl-s", str(TTL_S),
                              "--duplicate-every", "50", "--lease-s", "1.0",
                              "--recover-after-s", "3.0"], log=tmp_path / f"{name}.log")
        workers.append(worker)
        return worker

    def consumer() -> Worker:
        name = f"c{len(workers)}"
        worker = spawn(name, ["-m", "eoguard.demo.worker", "consumer", *common,
                              "--stats", str(tmp_path / f"{name}.json"), "--scope", scope,
                              "--group", f"chaos-{run}", "--instance", "chaos-member",
                              "--dead-letter-topic", dlq, "--grace-s", str(GRACE_S)],
                       log=tmp_path / f"{name}.log")
        workers.append(worker)
        return worker

    # Step 1. Chaos: every 0.8-2 s, SIGKILL one of the four (each twice, in random order) and
    # bring it back.
    prod, cons = producer(0, MESSAGES), consumer()
    kills = {"producer": 0, "consumer": 0, "kafka": 0, "redis": 0}
    victims = sorted(kills) * KILLS_EACH
    rng.shuffle(victims)
    for victim in victims:
        time.sleep(rng.uniform(0.8, 2.0))
        kills[victim] += 1
        if victim == "producer" and prod.alive():
            prod.kill()
            sent, _ = ledgers.read()
            next_seq = max(sent, default=-1) + 1
            prod = producer(next_seq, MESSAGES - next_seq) if next_seq < MESSAGES else prod
        elif victim == "consumer":
            cons.kill()
            cons = consumer()
        elif victim == "kafka":
            private_kafka.kill()
            time.sleep(rng.uniform(0.5, 2.0))
            private_kafka.start()
        elif victim == "redis":
            private_redis.kill()
            time.sleep(rng.uniform(0.3, 1.5))
            private_redis.start()

    # Step 2. Let the last producer finish (it also runs a final recovery) and the consumer drain.
    sent, _ = ledgers.read()
    if prod.alive() or max(sent, default=-1) + 1 < MESSAGES:
        prod.proc.wait(timeout=120)
        sent, _ = ledgers.read()
        if max(sent, default=-1) + 1 < MESSAGES:  # the chaos loop killed the last one
            producer(max(sent) + 1, MESSAGES - max(sent) - 1).proc.wait(timeout=120)
    # As in a real deployment, a producer keeps running: its periodic recovery takes over what
    # the killed ones left in the outbox once their leases lapse.
    recoverer = GuardedProducer(ProducerConfig(
        kafka={"bootstrap.servers": private_kafka.address, "message.timeout.ms": 15_000},
        redis=RedisConfig(url=private_redis.address), keyspace=keys, lease_s=1.0,
        recover_interval_s=0.5, instance_id="chaos-recoverer"))
    sent, guaranteed = ledgers.read()
    client = redis.Redis.from_url(private_redis.address)
    drain_deadline = time.monotonic() + 120
    while time.monotonic() < drain_deadline:
        handled = observe.effect_counts(client, keys, scope)
        if guaranteed <= handled.keys():
            break
        time.sleep(0.5)
    recoverer.close()
    time.sleep(2.0)  # anything in flight that would double-handle has time to show
    handled = observe.effect_counts(client, keys, scope)
    late = observe.late_count(client, keys, scope)
    dead = observe.dead_letters(private_kafka.address, dlq, topic)
    cons.stop(30)
    for worker in workers:
        worker.stop(10)

    # Step 3. Invariants 1-4.
    now = now_ms()
    live = {m for m in guaranteed if _message_created_ms(m) + int(TTL_S * 1000) > now}
    lost = live - handled.keys()
    doubled = {m: n for m, n in handled.items() if n != 1}
    expired_handled = set(injected.expired_ids) & handled.keys()
    malformed_missing = set(injected.malformed) - dead.keys()
    print(f"\nchaos seed={seed} kills={kills} recoverer_resent={recoverer.stats().resent} "
          f"sent={len(sent)} guaranteed={len(guaranteed)} "
          f"unexpired={len(live)} handled={len(handled)} lost={len(lost)} doubled={len(doubled)} "
          f"late={late} expired_injected={EXPIRED} expired_handled={len(expired_handled)} "
          f"malformed={len(injected.malformed)} dead_lettered={len(dead)}")
    assert sum(kills.values()) == 4 * KILLS_EACH
    assert len(guaranteed) > MESSAGES // 2, "too few messages guaranteed for the run to mean much"
    if lost:
        outbox = Outbox(client, keys)
        for message_id in sorted(lost)[:5]:
            print(f"lost {message_id}: outbox record {outbox.get(message_id)}")
    assert not lost, f"invariant 1 (no loss) broken for {len(lost)} guaranteed messages"
    assert not doubled, f"invariant 2 (no duplicate) broken: {list(doubled.items())[:5]}"
    assert late == 0, "invariant 3: a handler ran after expires_at"
    assert not expired_handled, "invariant 3: an expired message reached the handler"
    assert not malformed_missing, f"invariant 4: malformed records not dead-lettered: {malformed_missing}"

    # Step 4. Invariant 5: after expiry plus grace, no outbox record or dedup key remains.
    last_expiry_ms = max(_message_created_ms(m) for m in sent.values()) + int(TTL_S * 1000)
    wait_s = (last_expiry_ms + GRACE_S * 1000 - now_ms()) / 1000 + 1.0
    if wait_s > 0:
        time.sleep(wait_s)
    sweep_index(client, keys, dry_run=False)
    records = list(client.scan_iter(match=keys.outbox_record_pattern(), count=1000))
    dedup = [key for pattern in (keys.dedup_pattern(), keys.dedup_batch_pattern(),
                                 keys.dedup_reowned_pattern())
             for key in client.scan_iter(match=pattern, count=1000)]
    index_entries = sum(client.zcard(keys.outbox_index(s)) for s in range(keys.shards))
    print(f"after expiry + grace: outbox records={len(records)} claim keys, batch records and "
          f"re-owned hashes={len(dedup)} "
          f"index entries={index_entries}")
    assert records == []
    assert dedup == []
    assert index_entries == 0
