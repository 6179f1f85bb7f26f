"""GuardedProducer against the real Kafka and Redis: both modes, lifetimes, outages, bad input."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import redis
from confluent_kafka import Consumer

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.config import KeepUntil, PersistenceMode, ProducerConfig, RedisConfig
from eoguard.errors import (
    BackpressureError,
    InvalidMessageError,
    MessageTooLargeError,
    PayloadEncodeError,
    PersistError,
    ProducerClosedError,
    SchemaNotFoundError,
)
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox, RecordState
from tests.conftest import free_port

pytestmark = pytest.mark.integration

TTL_S = 600  # keeps what the tests leave in the shared Redis short-lived


def make_config(bootstrap: str, redis_url: str, prefix: str, **kw) -> ProducerConfig:
    kafka = {"bootstrap.servers": bootstrap, "linger.ms": 5, **kw.pop("kafka", {})}
    kw.setdefault("keyspace", KeySpace(prefix=prefix, shards=8))
    return ProducerConfig(kafka=kafka, redis=RedisConfig(url=redis_url), default_ttl_s=TTL_S,
                          **kw)


class Recorder:
    """Collects guaranteed / failed callbacks, checking each fires at most once per id."""

    def __init__(self, check=None) -> None:
        self.guaranteed: Counter[str] = Counter()
        self.failed: dict[str, Exception] = {}
        self.at: dict[str, float] = {}
        self.check = check
        self.lock = threading.Lock()

    def on_guaranteed(self, handle) -> None:
        if self.check:
            self.check(handle)
        with self.lock:
            self.guaranteed[handle.id] += 1
            self.at[handle.id] = time.monotonic()

    def on_failed(self, handle, error) -> None:
        with self.lock:
            self.failed[handle.id] = error


def consume(bootstrap: str, topic: str, expect: int, timeout_s: float = 60.0):
    """Every envelope on ``topic`` (stops once ``expect`` were read and the topic is idle)."""
    codec = EnvelopeCodec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out = []
    deadline = time.monotonic() + timeout_s
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, timeout=0.5)
            records = [m for m in batch if m.error() is None]
            out += [(m.key(), codec.decode(m.value())) for m in records]
            if records:
                idle_since = time.monotonic()
            elif len(out) >= expect and time.monotonic() - idle_since > 1.5:
                break
    finally:
        consumer.close()
    return out


def wait_until(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.cluster
def test_persist_first_writes_the_outbox_before_kafka(kafka_bootstrap, redis_url, redis_client,
                                                      key_prefix, new_topic) -> None:
    topic = new_topic()
    cfg = make_config(kafka_bootstrap, redis_url, key_prefix)
    outbox = Outbox(redis_client, cfg.keyspace)
    seen_in_outbox: list[bool] = []

    def in_outbox_when_guaranteed(handle) -> None:
        if len(seen_in_outbox) < 50:
            seen_in_outbox.append(outbox.get(handle.id) is not None)

    rec = Recorder(check=in_outbox_when_guaranteed)
    with GuardedProducer(cfg, on_guaranteed=rec.on_guaranteed) as producer:
        handles = [producer.send(topic, f"v{i}".encode(), key=f"k{i % 7}", ttl_s=300 + i,
                                 headers={"n": str(i)}) for i in range(3000)]
        assert producer.flush(30) == 0
        stats = producer.stats()
    assert all(seen_in_outbox)
    assert len(seen_in_outbox) == 50
    assert set(rec.guaranteed) == {h.id for h in handles}
    assert set(rec.guaranteed.values()) == {1}
    assert all(h.guaranteed for h in handles)
    assert (stats.sent, stats.guaranteed, stats.persisted, stats.published) == (3000,) * 4
    assert stats.mode is PersistenceMode.PERSIST_FIRST
    assert stats.queue_depth == 0
    # keep_until=consumed: every record is kept as published, TTL = its expires_at.
    for h in handles[::100]:
        stored = outbox.get(h.id)
        assert stored is not None
        assert stored.state is RecordState.PUBLISHED
        assert stored.expires_at_ms == h.expires_at_ms
    assert outbox.expire_times([h.id for h in handles]) == {h.id: h.expires_at_ms for h in handles}
    assert outbox.pending_ids() == {}
    # Kafka got every message once, as envelopes with the application's key.
    got = consume(kafka_bootstrap, topic, 3000)
    assert sorted(env.id for _, env in got) == sorted(h.id for h in handles)
    by_id = {h.id: (i, h) for i, h in enumerate(handles)}
    for key, env in got[:200]:
        i, h = by_id[env.id]
        assert (key, env.payload, env.attempt, env.headers) == (
            f"k{i % 7}".encode(), f"v{i}".encode(), 1, {"n": str(i)})
        assert env.expires_at_ms == h.expires_at_ms
    # The consumer's end-to-end ack deletes them.
    assert outbox.ack([h.id for h in handles]) == 3000
    assert outbox.get(handles[0].id) is None


@pytest.mark.cluster
def test_keep_until_published_deletes_records_on_kafka_ack(kafka_bootstrap, redis_url, redis_client,
                                                           key_prefix, new_topic) -> None:
    topic = new_topic()
    cfg = make_config(kafka_bootstrap, redis_url, key_prefix, keep_until=KeepUntil.PUBLISHED)
    with GuardedProducer(cfg) as producer:
        handles = [producer.send(topic, b"x" * 50) for _ in range(500)]
        assert producer.flush(30) == 0
        stats = producer.stats()
    assert stats.persisted == 500
    outbox = Outbox(redis_client, cfg.keyspace)
    assert outbox.expire_times([h.id for h in handles]) == {h.id: -2 for h in handles}
    assert outbox.pending_ids() == {}
    assert len(consume(kafka_bootstrap, topic, 500)) == 500


@pytest.mark.cluster
def test_delayed_mode_with_a_healthy_broker_rarely_writes_redis(kafka_bootstrap, redis_url,
                                                                key_prefix, new_topic) -> None:
    topic = new_topic()
    cfg = make_config(kafka_bootstrap, redis_url, key_prefix, mode="delayed",
                      delay_min_ms=50, delay_max_ms=2000)
    rec = Recorder()
    n, burst = 20_000, 2000
    written: list[int] = []  # Redis writes seen after each burst (the delay's, so they lag)
    with GuardedProducer(cfg, on_guaranteed=rec.on_guaranteed) as producer:
        handles = []
        for i in range(n):
            handles.append(producer.send(topic, b"p" * 200, key=str(i % 16)))
            if i % burst == burst - 1:
                time.sleep(0.05)  # a steady stream rather than one burst
                written.append(producer.stats().persisted - sum(written))
        assert producer.flush(30) == 0
        stats = producer.stats()
    written[-1] += stats.persisted - sum(written)
    fraction = stats.persisted / n
    quiet = sum(1 for w in written if w <= burst * 0.05)
    print(f"\ndelayed mode, healthy broker: {stats.persisted} of {n} messages written to Redis "
          f"({fraction:.2%}), per burst of {burst} {written}; writes avoided "
          f"{stats.redis_writes_avoided}; delay {stats.current_delay_ms:.0f} ms; ack p50/p99 "
          f"{stats.ack_latency_p50_ms:.1f}/{stats.ack_latency_p99_ms:.1f} ms")
    # "Rarely": the delay is 2x the ack p99, so only acks slower than that are written. On a
    # 2-core machine a broker hiccup of a few hundred ms (seen in CI on the three-node
    # topology: 6.2% and 10.7% of a run written, each time about one burst) makes the
    # messages of the bursts it covers go to Redis. So most bursts write (almost) nothing,
    # and a hiccup costs a few; a mode that wrote every message would write 100% of each.
    assert quiet >= 7, written
    assert fraction <= 0.30
    assert stats.redis_writes_avoided + stats.persisted == n
    assert set(rec.guaranteed) == {h.id for h in handles}
    assert set(rec.guaranteed.values()) == {1}
    assert cfg.delay_min_ms <= stats.current_delay_ms <= cfg.delay_max_ms
    assert stats.ack_latency_p99_ms is not None
    assert len(consume(kafka_bootstrap, topic, n)) == n


def test_broker_down_every_message_reaches_redis_and_goes_out_later(
        private_kafka, redis_url, redis_client, key_prefix) -> None:
    """Delayed: persisted and guaranteed through Redis (how soon after the send is printed).
    Persist-first: persisted and guaranteed, then pending. Both go out once the broker is
    back."""
    bootstrap = private_kafka.address
    topic = f"down-{uuid.uuid4().hex[:8]}"
    kafka = {"message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms": 1000}
    delayed_cfg = make_config(bootstrap, redis_url, key_prefix + "d", mode="delayed",
                              delay_min_ms=50, delay_max_ms=500, kafka=kafka)
    first_cfg = make_config(bootstrap, redis_url, key_prefix + "p", kafka=kafka)
    delayed_rec, first_rec = Recorder(), Recorder()
    delayed = GuardedProducer(delayed_cfg, on_guaranteed=delayed_rec.on_guaranteed)
    first = GuardedProducer(first_cfg, on_guaranteed=first_rec.on_guaranteed)
    try:
        # Warm up: the topic exists, and both producers know the broker.
        delayed.send(topic, b"warm")
        first.send(topic, b"warm")
        assert delayed.flush(30) == 0
        assert first.flush(30) == 0
        private_kafka.kill()
        sent_at = {}
        d_handles, p_handles = [], []
        for i in range(300):
            d_handles.append(delayed.send(topic, b"d%d" % i))
            p_handles.append(first.send(topic, b"p%d" % i))
            sent_at[d_handles[-1].id] = time.monotonic()
        wait_until(lambda: len(delayed_rec.guaranteed) == 301, 10, "delayed guarantees")
        wait_until(lambda: len(first_rec.guaranteed) == 301, 10, "persist-first guarantees")
        late = [delayed_rec.at[h.id] - sent_at[h.id] for h in d_handles]
        print(f"\nbroker down: delayed mode guaranteed 300/300 via Redis, slowest after "
              f"{max(late) * 1000:.0f} ms (max delay {delayed_cfg.delay_max_ms} ms)")
        d_out, p_out = Outbox(redis_client, delayed_cfg.keyspace), Outbox(redis_client,
                                                                          first_cfg.keyspace)
        for outbox, handles in ((d_out, d_handles), (p_out, p_handles)):
            states = {outbox.get(h.id).state for h in handles}  # type: ignore[union-attr]
            assert states == {RecordState.PENDING}
            assert outbox.expire_times([h.id for h in handles]) == {
                h.id: h.expires_at_ms for h in handles}
        assert delayed.stats().persisted >= 300  # (the warm-up too, if its ack was slow)
        # The broker returns: librdkafka delivers what it held; records become published.
        private_kafka.start()
        assert delayed.flush(90) == 0
        assert first.flush(90) == 0
        for outbox, handles in ((d_out, d_handles), (p_out, p_handles)):
            assert outbox.pending_ids() == {}
            assert {outbox.get(h.id).state for h in handles} == {  # type: ignore[union-attr]
                RecordState.PUBLISHED}
    finally:
        delayed.close(10)
        first.close(10)
    ids = {env.id for _, env in consume(bootstrap, topic, 602)}
    assert {h.id for h in d_handles + p_handles} <= ids


def test_bad_input_raises_typed_errors(kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    topic = new_topic()
    cfg = make_config(kafka_bootstrap, redis_url, key_prefix, max_message_bytes=1_000)
    producer = GuardedProducer(cfg)
    with pytest.raises(InvalidMessageError):
        producer.send("", b"x")
    with pytest.raises(InvalidMessageError):
        producer.send(topic, b"x", ttl_s=0)
    with pytest.raises(InvalidMessageError):
        producer.send(topic, b"x", ttl_s=-5)
    with pytest.raises(InvalidMessageError):
        producer.send(topic, "not bytes")
    with pytest.raises(InvalidMessageError):
        producer.send(topic, b"x", key=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        producer.send(topic, b"x", headers={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(MessageTooLargeError) as too_large:
        producer.send(topic, b"x" * 2_000)
    assert too_large.value.limit == 1_000
    assert too_large.value.size > 2_000
    with pytest.raises(SchemaNotFoundError):
        producer.send(topic, {"a": 1}, schema="eoguard.example.Nope")
    with pytest.raises(PayloadEncodeError):
        producer.send(topic, {"wrong": "fields"}, schema="eoguard.example.Order")
    assert producer.stats().sent == 0  # nothing was accepted
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send(topic, b"x")


def test_schema_payload_round_trips(kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    order = {
        "order_id": "o-1", "customer": "c-7", "amount": Decimal("12.34"), "currency": "EUR",
        "items": [{"sku": "s-1", "qty": 2, "unit_price": 6.17}],
        "created_at": datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc), "express": True,
        "attributes": {"channel": "web"}, "note": None,
    }
    topic = new_topic()
    with GuardedProducer(make_config(kafka_bootstrap, redis_url, key_prefix)) as producer:
        handle = producer.send(topic, order, schema="eoguard.example.Order")
        assert producer.flush(30) == 0
    (_, env), = consume(kafka_bootstrap, topic, 1)
    assert env.id == handle.id
    assert env.payload_schema == "eoguard.example.Order"
    assert PayloadCodec().decode_envelope(env) == order


def test_redis_down_in_persist_first_produces_nothing_unpersisted(
        private_redis, kafka_bootstrap, key_prefix, new_topic) -> None:
    topic = new_topic()
    cfg = make_config(kafka_bootstrap, private_redis.address, key_prefix, max_queue_messages=20,
                      send_timeout_s=0.5)
    rec = Recorder()
    producer = GuardedProducer(cfg, on_guaranteed=rec.on_guaranteed, on_failed=rec.on_failed)
    try:
        ok = [producer.send(topic, b"before") for _ in range(10)]
        assert producer.flush(30) == 0
        private_redis.kill()
        queued = [producer.send(topic, b"during") for _ in range(20)]  # the queue's bound
        with pytest.raises(PersistError):
            producer.send(topic, b"during")  # then a typed error
        assert not any(h.guaranteed for h in queued)
        assert not producer.stats().store_available
        time.sleep(0.5)
        assert len(consume(kafka_bootstrap, topic, 10, timeout_s=10)) == 10  # nothing unpersisted
        private_redis.start()
        wait_until(lambda: all(h.guaranteed for h in queued), 30, "guarantees after restart")
        after = producer.send(topic, b"after")
        assert producer.flush(30) == 0
        assert after.guaranteed
        assert producer.stats().store_available
    finally:
        producer.close(10)
    assert rec.failed == {}
    ids = {env.id for _, env in consume(kafka_bootstrap, topic, 31)}
    assert {h.id for h in ok + queued + [after]} == ids


@pytest.mark.parametrize("mode", ["persist-first", "delayed"])
def test_backpressure_when_kafka_cannot_take_more(mode, redis_url, key_prefix) -> None:
    """No broker at all: librdkafka's queue fills, then eoguard's, then send raises."""
    nowhere = f"127.0.0.1:{free_port()}"
    kafka = {"queue.buffering.max.messages": 5, "message.timeout.ms": 60_000}
    cfg = make_config(nowhere, redis_url, key_prefix, mode=mode, kafka=kafka,
                      max_queue_messages=10, send_timeout_s=0.3, delay_max_ms=100)
    rec = Recorder()
    producer = GuardedProducer(cfg, on_guaranteed=rec.on_guaranteed)
    accepted = send_until_refused(producer, BackpressureError)
    assert 5 <= len(accepted) <= 15
    # Every accepted message is still guaranteed, through Redis.
    wait_until(lambda: len(rec.guaranteed) == len(accepted), 10, "guarantees")
    producer.close(0.5)


def send_until_refused(producer: GuardedProducer, error: type[Exception]) -> list:
    """Send until ``error`` is raised; it must come only after blocking send_timeout_s."""
    accepted = []
    for _ in range(100):
        started = time.monotonic()
        try:
            accepted.append(producer.send("t", b"x"))
        except error:
            assert time.monotonic() - started >= producer.config.send_timeout_s * 0.9
            return accepted
    raise AssertionError(f"{error.__name__} never raised")


def test_a_raising_callback_is_logged_not_fatal(kafka_bootstrap, redis_url, key_prefix,
                                                new_topic, caplog) -> None:
    calls = []

    def boom(handle) -> None:
        calls.append(handle.id)
        raise RuntimeError("application bug")

    with GuardedProducer(make_config(kafka_bootstrap, redis_url, key_prefix),
                         on_guaranteed=boom) as producer:
        handles = [producer.send(new_topic(1), b"x") for _ in range(20)]
        assert producer.flush(30) == 0
        assert all(h.wait(5) for h in handles)
    assert sorted(calls) == sorted(h.id for h in handles)
    assert sum("application bug" in (r.exc_text or "") or r.exc_info is not None
               for r in caplog.records) >= 20


def test_handles_and_stats(kafka_bootstrap, redis_url, key_prefix, new_topic,
                           redis_client: redis.Redis) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, key_prefix, mode="delayed")
    with GuardedProducer(cfg) as producer:
        handle = producer.send(new_topic(1), b"x", ttl_s=30)
        assert handle.wait(10)
        assert handle.id
        assert len(handle.id) == 36
        assert handle.expires_at_ms > time.time() * 1000 + 25_000
        stats = producer.stats()
        assert stats.live_producers >= 1
        assert producer.instance_id in {m.decode() for m in redis_client.zrange(
            cfg.keyspace.live_producers(), 0, -1)}
    # close gave the lease up
    assert producer.instance_id not in {m.decode() for m in redis_client.zrange(
        cfg.keyspace.live_producers(), 0, -1)}
