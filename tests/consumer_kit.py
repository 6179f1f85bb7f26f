"""Helpers shared by the consumer tests and fault workers (envelopes and producing: eoguard.stack.feed)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from eoguard.codec import EnvelopeCodec
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.store.dedup import DedupStore
from eoguard.store.keys import KeySpace

CODEC = EnvelopeCodec()


DEFAULT_SCOPE = "app"
"""The scope of consumer_config's consumers unless a test names one."""


def consumer_config(bootstrap: str, redis_url: str, topics: Sequence[str], *, prefix: str,
                    scope: str = DEFAULT_SCOPE, group: str | None = None, shards: int | None = None,
                    kafka: dict[str, Any] | None = None, **overrides: Any) -> ConsumerConfig:
    conf = {"bootstrap.servers": bootstrap, "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000, **(kafka or {})}
    values: dict[str, Any] = {"poll_timeout_s": 0.2, "retry_backoff_s": 0.05,
                              "retry_backoff_max_s": 0.5, **overrides}
    return ConsumerConfig(kafka=conf, redis=RedisConfig(url=redis_url), scope=scope,
                          topics=tuple(topics),
                          keyspace=KeySpace(prefix=prefix, **({"shards": shards} if shards else {})),
                          **values)


def claims_by_script(monkeypatch: Any) -> None:
    """Consumers claim by the script alone, as before fresh passes (store/dedup_fresh.py): a
    copy's claim is then answered when its round trip runs, not when it lands, so a test can
    catch it BUSY behind done marks still in flight."""
    by_script = DedupStore.prepare_claim
    monkeypatch.setattr(DedupStore, "prepare_claim", lambda self, token, claims, **kw: by_script(
        self, token, claims, give_up_busy=kw.get("give_up_busy", False)))


def recorder() -> tuple[list[str], Callable[[HandlerContext], None]]:
    seen: list[str] = []
    return seen, lambda ctx: seen.append(ctx.message_id)


def drain(consumers: Sequence[GuardedConsumer], done: Callable[[], bool], *,
          timeout_s: float = 60.0, settle_polls: int = 3) -> None:
    """Poll the consumers round-robin until ``done()``, then a few more empty polls."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "consumers did not finish in time"
        for consumer in consumers:
            consumer.poll_once()
    for _ in range(settle_polls):
        for consumer in consumers:
            consumer.poll_once()


def read_all(bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0) -> list[Any]:
    """At least ``count`` records of ``topic`` from the beginning (plain consumer)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            out += [m for m in consumer.consume(500, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return out


def headers_of(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or []) if v is not None}


def committed_total(bootstrap: str, group: str, topic: str, partitions: int) -> tuple[int, int]:
    """(sum of the group's committed offsets, sum of the partitions' end offsets)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        committed = consumer.committed(parts, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        return sum(max(tp.offset, 0) for tp in committed), sum(ends)
    finally:
        consumer.close()


class ConsumerThread:
    """A GuardedConsumer polling on a daemon thread (after ``after`` is set, if given) until
    :meth:`stop`, which returns its stats and raises what the thread met."""

    def __init__(self, config: ConsumerConfig, handler: Callable[[HandlerContext], None], *,
                 after: threading.Event | None = None) -> None:
        self.config = config
        self.handler = handler
        self.after = after
        self._stop = threading.Event()
        self._stats: list[Any] = []
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self.after is not None and not self.after.wait(0.1):
                if self._stop.is_set():
                    return
            with GuardedConsumer(self.config, handler=self.handler) as consumer:
                while not self._stop.is_set():
                    consumer.poll_once()
                self._stats.append(consumer.stats())
        except BaseException as exc:  # raised by stop(), on the test's thread
            self._failure.append(exc)

    @property
    def failure(self) -> BaseException | None:
        return self._failure[0] if self._failure else None

    def stop(self) -> Any:
        """Stop polling; the consumer's stats (None if it never started)."""
        self._stop.set()
        self._thread.join(60)
        if self._failure:
            raise self._failure[0]
        return self._stats[0] if self._stats else None


class Record:
    """A consumed Kafka record: what the consumer's pipeline reads of confluent-kafka's
    Message (for the unit tests, which run no broker)."""

    def __init__(self, offset: int, value: bytes, partition: int = 0, topic: str = "t") -> None:
        self._offset, self._value, self._partition, self._topic = offset, value, partition, topic

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes | None:
        return None

    def headers(self) -> None:
        return None
