"""Redis SIGKILLed and restarted from its AOF: no guaranteed message is lost."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.errors import BackpressureError, PersistError
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from tests.conftest import free_port
from tests.fault.producer_fault_kit import (
    ProducerWorker,
    payloads_by_partition,
    read_topic,
    recover_concurrently,
    recovering_config,
)

pytestmark = pytest.mark.fault


def test_outbox_survives_redis_and_producer_crash(tmp_path, private_redis, kafka_bootstrap,
                                                  key_prefix, new_topic) -> None:
    """Guaranteed only by the outbox (Kafka unreachable for the worker), then Redis and the
    producer are both SIGKILLed: after Redis replays its AOF, recovery delivers them all.

    Redis runs with ``appendfsync always`` here: with ``everysec`` Redis may postpone the
    AOF write() for up to 2 s while a background fsync is slow and still acknowledge the
    writes, so a SIGKILL on a busy disk can lose acknowledged outbox writes (aof.c,
    flushAppendOnlyFile). The outbox is exactly as durable as Redis's fsync policy.
    """
    admin = redis.Redis.from_url(private_redis.address)
    admin.config_set("appendfsync", "always")
    admin.close()
    topic = new_topic()
    nowhere = f"127.0.0.1:{free_port()}"
    worker = ProducerWorker(tmp_path, bootstrap=nowhere, redis_url=private_redis.address,
                            prefix=key_prefix, topic=topic, mode="persist-first", rate=5_000)
    deadline = time.monotonic() + 60
    while len(worker.guaranteed()) < 3_000:
        assert time.monotonic() < deadline, "the worker guaranteed too little"
        time.sleep(0.05)
    private_redis.kill()  # SIGKILL while the worker is writing
    guaranteed = set(worker.kill_after(0))
    private_redis.start()  # replays the AOF
    client = redis.Redis.from_url(private_redis.address)
    outbox = Outbox(client, KeySpace(prefix=key_prefix, shards=8))
    in_outbox = {i for ids in outbox.pending_ids().values() for i in ids}
    time.sleep(2.0)  # the worker's liveness lease lapses
    cfg = recovering_config(kafka_bootstrap, private_redis.address, key_prefix)
    resent = recover_concurrently([cfg])
    seen, _ = read_topic(kafka_bootstrap, topic, expect_ids=guaranteed)
    missing = guaranteed - seen.keys()
    print(f"\n{len(guaranteed)} guaranteed via the outbox before Redis was SIGKILLed; "
          f"{len(in_outbox)} records after the AOF replay; {resent[0]} resent; "
          f"{len(missing)} guaranteed missing from Kafka")
    lost = sorted(guaranteed - in_outbox)
    print(f"lost in the AOF replay: {len(lost)}; newest guaranteed {max(guaranteed)}; "
          f"oldest lost {lost[:1]}")
    assert guaranteed <= in_outbox  # every acknowledged outbox write survived the crash
    assert not missing
    assert outbox.pending_ids() == {}
    client.close()


def test_streaming_through_a_redis_restart_loses_nothing(private_redis, kafka_bootstrap,
                                                         key_prefix, new_topic) -> None:
    """A producer keeps sending while its Redis is SIGKILLed and restarted: sends fail with
    a typed error while the queue is full, resume afterwards, and every guaranteed message
    reaches Kafka, in send order (writes in flight when Redis died went back in order)."""
    topic = new_topic()
    cfg = ProducerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
                         redis=RedisConfig(url=private_redis.address),
                         keyspace=KeySpace(prefix=key_prefix, shards=8), default_ttl_s=900,
                         max_queue_messages=2_000, send_timeout_s=0.2, lease_s=3)
    guaranteed: set[str] = set()
    failed: dict[str, Exception] = {}
    refused: list[Exception] = []
    stop = threading.Event()
    producer = GuardedProducer(cfg, on_guaranteed=lambda h: guaranteed.add(h.id),
                               on_failed=lambda h, e: failed.setdefault(h.id, e))

    def send_forever() -> None:
        i = 0
        while not stop.is_set():
            try:
                producer.send(topic, b"m%d" % i)
            except (PersistError, BackpressureError) as exc:
                refused.append(exc)
            i += 1
            if i % 100 == 0:
                time.sleep(0.01)

    sender = threading.Thread(target=send_forever)
    sender.start()
    try:
        time.sleep(1.0)
        before = len(guaranteed)
        private_redis.kill()
        time.sleep(1.5)
        during = len(guaranteed)
        private_redis.start()
        time.sleep(2.0)
    finally:
        stop.set()
        sender.join()
    assert producer.flush(60) == 0
    after = len(guaranteed)
    producer.close(10)
    seen, _ = read_topic(kafka_bootstrap, topic, expect_ids=guaranteed)
    missing = guaranteed - seen.keys()
    print(f"\nguaranteed before the kill {before}, while Redis was down {during - before}, "
          f"after the restart {after - during}; sends refused {len(refused)} "
          f"({sorted({type(e).__name__ for e in refused})}); missing from Kafka {len(missing)}")
    assert refused
    assert all(isinstance(e, (PersistError, BackpressureError)) for e in refused)
    assert any(isinstance(e, PersistError) for e in refused)  # the outbox was the cause
    assert after > during  # sends resumed once Redis was back
    assert failed == {}
    assert not missing
    # Nothing was resent (Kafka was up, the producer live): each partition holds its
    # messages once, in the order they were sent.
    partitions = payloads_by_partition(kafka_bootstrap, topic, expect=sum(seen.values()))
    for payloads in partitions.values():
        numbers = [int(p[1:]) for p in payloads]
        assert numbers == sorted(set(numbers))
