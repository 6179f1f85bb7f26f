"""Helpers of the producer fault tests: the worker process, reading a topic, recovering."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer

from eoguard.codec import EnvelopeCodec
from eoguard.config import ProducerConfig, RedisConfig
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace

WORKER = Path(__file__).resolve().parent / "workers" / "producer_worker.py"
ROOT = Path(__file__).resolve().parents[2]


class ProducerWorker:
    """``producer_worker.py`` in a subprocess; ``guaranteed()`` reads the ids it reported."""

    def __init__(self, tmp: Path, *, bootstrap: str, redis_url: str, prefix: str, topic: str,
                 mode: str, rate: float = 0.0, delay_ms: int = 0,
                 extra: list[str] | None = None) -> None:
        self.report = tmp / f"guaranteed-{uuid.uuid4().hex[:6]}.txt"
        self.log = (tmp / "producer_worker.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--bootstrap", bootstrap, "--redis", redis_url,
             "--prefix", prefix, "--topic", topic, "--mode", mode, "--report", str(self.report),
             "--rate", str(rate), "--delay-ms", str(delay_ms), *(extra or [])],
            stdout=self.log, stderr=self.log, cwd=ROOT)

    def guaranteed(self) -> list[str]:
        if not self.report.exists():
            return []
        lines = self.report.read_text().split("\n")
        return [line for line in lines[:-1] if line]  # the last one may be half-written

    def kill_after(self, at_least: int, timeout_s: float = 90.0) -> list[str]:
        """SIGKILL once ``at_least`` ids were guaranteed (plus a random moment more)."""
        deadline = time.monotonic() + timeout_s
        while len(self.guaranteed()) < at_least:
            assert self.proc.poll() is None, f"worker exited early, see {self.log.name}"
            assert time.monotonic() < deadline, f"worker too slow, see {self.log.name}"
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.3))
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()
        return self.guaranteed()


def read_topic(bootstrap: str, topic: str, *, expect_ids: set[str],
               timeout_s: float = 90.0) -> tuple[Counter[str], Counter[str]]:
    """(records per id, resends per id) of every envelope on ``topic``.

    Reads until every id of ``expect_ids`` was seen and the topic stayed idle for 2 s.
    """
    codec = EnvelopeCodec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen: Counter[str] = Counter()
    resends: Counter[str] = Counter()
    deadline = time.monotonic() + timeout_s
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = [m for m in consumer.consume(5000, timeout=0.5) if m.error() is None]
            for m in batch:
                env = codec.decode(m.value())
                seen[env.id] += 1
                if env.attempt > 1:
                    resends[env.id] += 1
            if batch:
                idle_since = time.monotonic()
            elif expect_ids <= seen.keys() and time.monotonic() - idle_since > 2.0:
                break
    finally:
        consumer.close()
    return seen, resends


def payloads_by_partition(bootstrap: str, topic: str, *, expect: int,
                          timeout_s: float = 60.0) -> dict[int, list[bytes]]:
    """The envelope payloads on ``topic``, per partition in offset order (``expect`` in all)."""
    codec = EnvelopeCodec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: dict[int, list[bytes]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while sum(map(len, out.values())) < expect and time.monotonic() < deadline:
            for m in consumer.consume(5000, timeout=0.5):
                if m.error() is None:
                    out.setdefault(m.partition(), []).append(codec.decode(m.value()).payload)
    finally:
        consumer.close()
    return out


def recovering_config(bootstrap: str, redis_url: str, prefix: str) -> ProducerConfig:
    return ProducerConfig(kafka={"bootstrap.servers": bootstrap, "message.timeout.ms": 30_000},
                          redis=RedisConfig(url=redis_url),
                          keyspace=KeySpace(prefix=prefix, shards=8), default_ttl_s=900,
                          lease_s=1.5)


def recover_concurrently(configs: list[ProducerConfig]) -> list[int]:
    """Start one producer per config at the same instant (each recovers at start), flush,
    close; returns how many records each one resent."""
    barrier = threading.Barrier(len(configs))
    resent = [0] * len(configs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            with GuardedProducer(configs[i]) as producer:
                assert producer.flush(60) == 0
                resent[i] = producer.stats().resent
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(configs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return resent
