"""A rolling upgrade from the previous release, on one topic, one scope, one consumer group.

The previous release is commit c04753f, vendored as tests/data/eoguard-c04753f.tar.gz (made
with ``git archive --format=tar.gz c04753f eoguard schemas``) so a shallow clone runs this test too. Its
tree is unpacked per test and its producer and consumer run in subprocesses with PYTHONPATH on
it (tests/fault/workers' producer and consumer, which use API both releases have), beside the
current code's.

Steps, as an operator upgrades (docs/compatibility.md): an old and a new consumer share the
group; an old and a new producer send orders 0..599 and 400..999 at once (400..599 twice,
under the same ids); the old consumer is stopped; the new producer sends 1000..1199. Every
order's effect (a counter, applied with its done mark) is 1, the group committed every
record, and the outbox record of every order sent once, by either producer, is acknowledged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

import eoguard
from eoguard.envelope import message_id_for
from eoguard.store.keys import KeySpace
from eoguard.store.outbox_admin import scan_records
from tests.consumer_kit import committed_total
from tests.fault.consumer_fault_kit import Worker, effect_counts

pytestmark = pytest.mark.integration

RELEASE = "c04753f"
ARCHIVE = Path(__file__).resolve().parents[1] / "data" / f"eoguard-{RELEASE}.tar.gz"
CURRENT = Path(eoguard.__file__).resolve().parents[1]
PARTITIONS, SCOPE = 4, "orders"


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """The previous release's source tree (its ``eoguard`` package and ``schemas/``), unpacked."""
    tree = tmp_path / f"eoguard-{RELEASE}"
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(tree, filter="data")
    return tree


@pytest.fixture
def trees(previous_release: Path) -> dict[str, Path]:
    """Each release's tree, checked to be the one its workers import (run from a directory
    without an ``eoguard``, as a worker script is: its own directory is first on sys.path)."""
    releases = {"old": previous_release, "new": CURRENT}
    for tree in releases.values():
        where = subprocess.run([sys.executable, "-c", "import eoguard; print(eoguard.__file__)"],
                               env=_env(tree), cwd=previous_release.parent,
                               capture_output=True, text=True, check=True)
        assert Path(where.stdout.strip()).is_relative_to(tree), where.stdout
    return releases


def _env(tree: Path) -> dict[str, str]:
    """This environment with ``tree`` first on PYTHONPATH: the venv's packages, that code."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def _consumer(tree: Path, log: Path, *args: str) -> Worker:
    worker = Worker("consumer_worker.py", *args, log=log, env=_env(tree))
    assert worker.wait_for("ready") is not None, f"the consumer exited (see {log})"
    return worker


def _send(tree: Path, log: Path, report: Path, args: tuple[str, ...], first: int,
          orders: int) -> Worker:
    return Worker("producer_worker.py", *args, "--report", str(report), "--first", str(first),
                  "--orders", str(orders), "--shards", str(KeySpace().shards), log=log,
                  env=_env(tree))


def _all_committed(bootstrap: str, group: str, topic: str, at_least: int) -> Callable[[], bool]:
    """The group committed up to every partition's end, and the topic holds ``at_least``."""
    def check() -> bool:
        committed, ends = committed_total(bootstrap, group, topic, PARTITIONS)
        return committed == ends >= at_least

    return check


def _orders(first: int, last: int) -> set[str]:
    return {message_id_for("orders", f"order-{i:06d}") for i in range(first, last)}


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def _members_assigned(bootstrap: str, group: str, members: int) -> Callable[[], bool]:
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def check() -> bool:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
        return (desc.state == ConsumerGroupState.STABLE and len(desc.members) == members
                and all(m.assignment.topic_partitions for m in desc.members))

    return check


def test_rolling_upgrade_from_the_previous_release_handles_every_order_once(
        trees: dict[str, Path], new_topic, kafka_bootstrap: str, redis_url: str,
        key_prefix: str, tmp_path: Path) -> None:
    old, new = trees["old"], trees["new"]
    topic = new_topic(PARTITIONS)
    group = f"upgrade-{uuid.uuid4().hex[:8]}"
    log, report = tmp_path / "workers.log", tmp_path / "guaranteed.txt"
    consumer_args = (kafka_bootstrap, redis_url, topic, key_prefix, SCOPE, group)
    producer_args = ("--bootstrap", kafka_bootstrap, "--redis", redis_url, "--prefix",
                     key_prefix, "--topic", topic)
    old_consumer = _consumer(old, log, *consumer_args, "old")
    new_consumer = _consumer(new, log, *consumer_args, "new")
    try:
        _wait("both consumers in the group, each with partitions",
              _members_assigned(kafka_bootstrap, group, 2))

        producers = [_send(old, log, report, producer_args, 0, 600),
                     _send(new, log, report, producer_args, 400, 600)]
        for producer in producers:
            assert producer.wait() == 0, f"a producer failed (see {log})"
        for consumer in (old_consumer, new_consumer):  # both releases handled records
            assert consumer.wait_for("batch") is not None, f"see {log}"
        # 1,000 to 1,200 records: a second send of orders 400..599 finds the first one's
        # outbox record while it is there, and is then not published again.
        _wait("the group committed every record", _all_committed(kafka_bootstrap, group, topic, 1000))
        old_consumer.stop()
        before = committed_total(kafka_bootstrap, group, topic, PARTITIONS)[1]

        assert _send(new, log, report, producer_args, 1000, 200).wait() == 0, f"see {log}"
        _wait("the new consumer alone committed the last orders",
              _all_committed(kafka_bootstrap, group, topic, before + 200))
    finally:
        for consumer in (old_consumer, new_consumer):
            if consumer.proc.poll() is None:
                consumer.stop()

    client = redis.Redis.from_url(redis_url)
    keys = KeySpace(prefix=key_prefix)
    seen, counts = effect_counts(client, keys, SCOPE)
    assert seen == _orders(0, 1200)
    assert set(counts.values()) == {1}, {i: n for i, n in counts.items() if n != 1}
    assert set(counts) == seen
    # Orders sent once: their records acknowledged, by either release's consumer. Orders
    # 400..599 were sent by both producers: a copy written after the first one's record was
    # acknowledged is dropped as a duplicate and never acknowledged, so its record stays,
    # published, until its expires_at (the same with two current producers; docs/design.md
    # "Ids an application supplies").
    left = {r.id for page in scan_records(client, keys) for r in page}
    assert left <= _orders(400, 600), left - _orders(400, 600)
