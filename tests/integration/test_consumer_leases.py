"""Claims outlive slow batches, and two readers of one scope never both handle a record.

Two GuardedConsumers of one scope in two groups read the same topic at once: each record is
claimed by one (its owner token names its group) and waited on by the other until done.
Batches take longer to handle than the claim lease, so only the lease renewal keeps the
other reader from taking the claims over and handling them a second time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.consumer.lease import LeaseKeeper
from eoguard.envelope import new_message_id, now_ms
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import DedupState, DedupStore, owner_token
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
    assert stats["a"].leases_lost + stats["b"].leases_lost == 0
    assert stats["a"].busy_skipped + stats["b"].busy_skipped == 0


def test_claims_sent_ahead_never_lapse_while_their_batch_waits(
        kafka_bootstrap: str, redis_url: str, redis_client: Any, key_prefix: str,
        new_topic: Any) -> None:
    # The pipeline sends a batch's claims two batches before it handles it, and reads their
    # answer only then. With 0.5 s batches that is 1 s unread: a whole lease. A watcher reads
    # every dedup key every 50 ms; a claim past its deadline is one another reader of the
    # scope could take over and handle a second time. (Renewed only from their landing on,
    # the claims of every batch read ahead lapsed here.)
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
    keys = [config.keyspace.dedup(config.scope, e.id) for e in envs]
    lapsed: set[str] = set()
    reads = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            now_ms = time.time() * 1000
            reads[0] += 1
            for key, value in zip(keys, redis_client.mget(keys), strict=True):
                if value is not None and value.startswith(b"c|") \
                        and int(value.split(b"|")[1]) < now_ms - 20:
                    lapsed.add(key)

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
    print(f"handled={len(handled)} watcher reads={reads[0]} of {len(keys)} keys each; "
          f"claims seen past their deadline={len(lapsed)}; renewals={stats.lease_renewals} "
          f"lost={stats.leases_lost}")
    assert sorted(handled) == sorted(e.id for e in envs)
    assert reads[0] > 50  # the watcher looked throughout
    assert stats.lease_renewals > 0
    assert lapsed == set()
    assert stats.leases_lost == 0


def test_a_claim_whose_answer_is_not_read_is_never_claimed_by_its_renewal(
        redis_client: Any, key_prefix: str) -> None:
    # A copy of a message held elsewhere is sent for claiming: its answer (BUSY) is read two
    # polls later. If the other owner gives the key back meanwhile, a renewal that claimed
    # again would take the key for a claim the consumer then sets aside as BUSY, and nobody
    # would renew, mark or release it: the message's other copies would wait on it.
    store = DedupStore(redis_client, scope="app", keys=KeySpace(prefix=key_prefix))
    mid, later = new_message_id(), new_message_id()
    other = store.new_claim(mid, owner_token("app", "g", "t", 0, 1), now_ms() + 60_000)
    copy = store.new_claim(mid, owner_token("app", "g", "t", 0, 2), now_ms() + 60_000)
    on_its_way = store.new_claim(later, owner_token("app", "g", "t", 0, 3), now_ms() + 60_000)
    store.claim([other])
    keeper = LeaseKeeper(store, interval_s=3600, max_hold_s=3600)
    try:
        keeper.hold([copy, on_its_way], answered=False)
        store.release([other])
        keeper.renew()
        assert redis_client.exists(store.key(mid)) == 0  # not taken by the renewal
        assert redis_client.exists(store.key(later)) == 0
        assert keeper.held() == 2  # nothing says they are not ours yet
        store.claim([other])  # held by another owner again
        keeper.renew()
        assert keeper.held() == 2  # the answer, when read, drops the copy (sort)
        assert keeper.lost == 0
        assert store.check(mid).owner == other.owner  # type: ignore[union-attr]
        keeper.drop([copy])
        # Once its answer says ours, a claim is renewed by claiming again, as before.
        store.claim([on_its_way])
        keeper.hold([on_its_way])
        keeper.renew()
        entry = store.check(later)
        assert entry is not None
        assert entry.state is DedupState.CLAIMED
        assert entry.owner == on_its_way.owner
        assert keeper.held() == 1
        assert keeper.renewals == 3
    finally:
        keeper.close()


def test_max_hold_counts_from_the_answer_not_from_the_send(redis_client: Any,
                                                          key_prefix: str) -> None:
    # Renewal stops max_hold_s (max.poll.interval.ms) after a claim is held: a handler hung
    # that long lost its partitions. Claims sent ahead wait behind the batches being handled;
    # counted from their send, slow batches would lose their renewal while being handled.
    store = DedupStore(redis_client, scope="app", keys=KeySpace(prefix=key_prefix))
    ahead = store.new_claim(new_message_id(), owner_token("app", "g", "t", 0, 1),
                            now_ms() + 60_000)
    keeper = LeaseKeeper(store, interval_s=3600, max_hold_s=0.3)
    try:
        keeper.hold([ahead], answered=False)
        store.claim([ahead])
        time.sleep(0.4)  # longer than max_hold_s, waiting behind other batches
        keeper.hold([ahead])  # its answer is read: its batch is handled next
        keeper.renew()
        assert keeper.held() == 1  # still renewed
        time.sleep(0.4)  # now held past max_hold_s: a hung handler
        keeper.renew()
        assert keeper.held() == 0
    finally:
        keeper.close()
