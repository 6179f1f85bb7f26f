"""Batch leases outlive slow batches, and two readers of one scope never both handle a record.

Two GuardedConsumers of one scope in two groups read the same topic at once: each record is
claimed by one (its position names its group) and waited on by the other until done.
Batches take longer to handle than the lease, so only the renewal of the batch records keeps
the other reader from taking the claims over and handling them a second time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.consumer.leases import BatchLeases
from eoguard.envelope import new_message_id, now_ms
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import BatchState, DedupStore, RenewResult, position
from eoguard.store.keys import KeySpace
from tests.consumer_kit import consumer_config

pytestmark = pytest.mark.integration

LEASE_S = 1.0
HANDLER_S = 0.06
BATCH = 30  # 30 x 0.06 s = 1.8 s per batch, longer than the lease


def test_two_readers_of_one_scope_with_slow_batches_handle_each_record_once(
        kafka_bootstrap: str, redis_url: str, key_prefix: str, new_topic: Any) -> None:
    topic = new_topic(2)
    envs = [envelope(b"slow %d" % i) for i in range(60)]
    produce(kafka_bootstrap, topic, envs)
    seen: dict[str, list[str]] = {"a": [], "b": []}
    consumers: dict[str, GuardedConsumer] = {}
    for name, record in seen.items():
        def handler(ctx: HandlerContext, out: list[str] = record) -> None:
            time.sleep(HANDLER_S)
            out.append(ctx.message_id)
        config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                                 scope="app", group=f"reader-{name}-{key_prefix}",
                                 lease_s=LEASE_S, busy_wait_s=20.0, batch_size=BATCH,
                                 dead_letter_topic=new_topic(1, prefix="dlq"))
        consumers[name] = GuardedConsumer(config, handler=handler)
    stop = threading.Event()

    def settled(c: GuardedConsumer) -> bool:
        stats = c.stats()
        done = stats.handled + stats.duplicates + stats.fenced + stats.busy_skipped
        return done >= len(envs) and stats.in_flight == 0

    def loop(c: GuardedConsumer) -> None:
        while not stop.is_set():
            c.poll_once()

    threads = [threading.Thread(target=loop, args=(c,)) for c in consumers.values()]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 90
        while not all(settled(c) for c in consumers.values()):
            assert time.monotonic() < deadline, {n: c.stats() for n, c in consumers.items()}
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        for c in consumers.values():
            c.close()
    stats = {name: c.stats() for name, c in consumers.items()}
    handled = Counter(seen["a"] + seen["b"])
    print(f"handled by a={len(seen['a'])} b={len(seen['b'])} distinct={len(handled)} "
          f"twice={sum(1 for n in handled.values() if n > 1)} renewals="
          f"{stats['a'].lease_renewals}+{stats['b'].lease_renewals} "
          f"busy waits={stats['a'].busy_waits}+{stats['b'].busy_waits}")
    assert handled == Counter(e.id for e in envs)  # every record once, none twice
    assert stats["a"].lease_renewals + stats["b"].lease_renewals > 0
    assert stats["a"].fenced + stats["b"].fenced == 0  # no claim was taken over while held
    assert stats["a"].busy_skipped + stats["b"].busy_skipped == 0


def test_batches_sent_ahead_never_lapse_while_they_wait(
        kafka_bootstrap: str, redis_url: str, redis_client: Any, key_prefix: str,
        new_topic: Any) -> None:
    # The pipeline sends a batch's claims two batches before it handles it. With 0.5 s batches
    # that is 1 s: a whole lease. A watcher reads every batch record of the scope every 50 ms;
    # an open record past its deadline holds claims another reader of the scope could take
    # over and handle a second time.
    topic = new_topic(1)
    envs = [envelope(b"ahead %d" % i) for i in range(120)]
    produce(kafka_bootstrap, topic, envs, partition=0)
    config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                             lease_s=LEASE_S, batch_size=10)
    handled: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        time.sleep(0.05)  # 10 x 0.05 s = 0.5 s per batch
        handled.append(ctx.message_id)

    consumer = GuardedConsumer(config, handler=handler)
    keys = config.keyspace
    claim_keys = [keys.dedup(config.scope, e.id) for e in envs]
    shards = [keys.shard_of(e.id) for e in envs]
    lapsed: set[str] = set()
    reads, records = [0], set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            now = time.time() * 1000
            reads[0] += 1
            held = {keys.dedup_batch(config.scope, shard, value.split(b"|")[1].decode())
                    for shard, value in zip(shards, redis_client.mget(claim_keys), strict=True)
                    if value is not None}
            records.update(held)
            names = sorted(held)
            for name, value in zip(names, redis_client.mget(names) if names else [], strict=True):
                if value is not None and value.startswith(b"o|") \
                        and int(value.split(b"|")[1]) < now - 20:
                    lapsed.add(name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        deadline = time.monotonic() + 60
        while len(handled) < len(envs) or consumer.stats().in_flight:
            assert time.monotonic() < deadline, consumer.stats()
            consumer.poll_once()
    finally:
        stop.set()
        watcher.join(timeout=10)
        consumer.close()
    stats = consumer.stats()
    print(f"handled={len(handled)} watcher reads={reads[0]}, batch records seen={len(records)}; "
          f"open records past their deadline={len(lapsed)}; renewals={stats.lease_renewals}")
    assert sorted(handled) == sorted(e.id for e in envs)
    assert reads[0] > 20  # the watcher looked throughout
    assert len(records) >= 12  # one per batch at least
    assert stats.lease_renewals > 0
    assert lapsed == set()
    assert stats.fenced == 0


def test_a_renewal_writes_only_records_that_are_open(redis_client: Any, key_prefix: str) -> None:
    # Leases are held from the moment a batch's claims are sent: a renewal may run before the
    # claim call itself, and after the done marks. Neither may create or reopen a record.
    store = DedupStore(redis_client, scope="app", keys=KeySpace(prefix=key_prefix))
    claims = [store.new_claim(new_message_id(), position("g", "t", 0, i), now_ms() + 60_000)
              for i in range(40)]
    token = store.new_token()
    records = store.records(token, claims)
    leases = BatchLeases(store, interval_s=3600, max_hold_s=3600)
    try:
        leases.hold(token, records)
        leases.renew()  # before the claim call: nothing to renew, nothing written
        assert redis_client.exists(*(key for _, key in records)) == 0
        store.claim(token, claims)
        before = [redis_client.get(key) for _, key in records]
        time.sleep(0.01)
        leases.renew()
        after = [redis_client.get(key) for _, key in records]
        assert all(a.startswith(b"o|") and int(a[2:]) > int(b[2:])
                   for a, b in zip(after, before, strict=True))
        store.done(token, claims)
        leases.renew()  # a renewal racing the done marks: the records stay done
        assert all(redis_client.get(key).startswith(b"d|") for _, key in records)
        assert store.renew(records) == [RenewResult.DONE] * len(records)
        assert leases.renewals == 3
        leases.drop(token)
        assert leases.held() == 0
    finally:
        leases.close()


def test_renewal_stops_after_max_hold(redis_client: Any, key_prefix: str) -> None:
    # Renewal stops max_hold_s (max.poll.interval.ms) after a batch is held: a handler hung
    # that long lost its partitions, and its claims must lapse for the record's next reader.
    store = DedupStore(redis_client, scope="app", keys=KeySpace(prefix=key_prefix),
                       lease_ms=60_000)
    claims = [store.new_claim(new_message_id(), position("g", "t", 0, 1), now_ms() + 60_000)]
    token = store.new_token()
    leases = BatchLeases(store, interval_s=3600, max_hold_s=0.3)
    try:
        leases.hold(token, store.records(token, claims))
        store.claim(token, claims)
        leases.renew()
        assert leases.held() == 1
        time.sleep(0.4)  # held past max_hold_s: a hung handler
        leases.renew()
        assert leases.held() == 0
        entry = store.check(claims[0].message_id)
        assert entry is not None
        assert entry.batch is not None
        assert entry.batch.state is BatchState.OPEN
    finally:
        leases.close()
