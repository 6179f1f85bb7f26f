"""An application that crashes and sends the same orders again: each is handled once per scope.

A producer process sends orders under ids derived from the order number and is SIGKILLed
while some are not yet guaranteed; a new process (recovering on start, as an application
restart would) sends every order again. Two consumer scopes then read the topic: every order
is handled exactly once in each, whatever reached Kafka once, twice or three times.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.envelope import message_id_for
from tests.consumer_kit import consumer_config, drain
from tests.fault.producer_fault_kit import ROOT, WORKER, ProducerWorker

pytestmark = pytest.mark.fault

ORDERS = 3_000


@pytest.mark.parametrize("mode", ["persist-first", "delayed"])
def test_orders_sent_again_after_a_crash_are_handled_once_per_scope(
        mode, tmp_path, kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    # Copies reach Kafka only where the kill caught records in flight; a run that left each
    # order on the topic once did not test dedup, so the crash is tried again (at most 3).
    for attempt in range(1, 4):
        records = crash_and_send_again(mode, tmp_path / f"a{attempt}", kafka_bootstrap,
                                       redis_url, f"{key_prefix}a{attempt}", new_topic(4))
        if records > ORDERS:
            break
    assert records > ORDERS, "no order reached Kafka twice in 3 crashes: dedup was not tested"


def crash_and_send_again(mode: str, tmp_path: Path, kafka_bootstrap: str, redis_url: str,
                         key_prefix: str, topic: str) -> int:
    """One crash and restart, checked; returns how many records the topic holds."""
    tmp_path.mkdir()
    first = ProducerWorker(tmp_path, bootstrap=kafka_bootstrap, redis_url=redis_url,
                           prefix=key_prefix, topic=topic, mode=mode, rate=1_500,
                           extra=["--orders", str(ORDERS)])
    before = set(first.kill_after(random.randint(300, ORDERS // 2)))
    assert len(before) < ORDERS, "the first process finished before it was killed"
    time.sleep(2.0)  # its 1.5 s liveness lease lapses: the second process recovers its records
    second = subprocess.run(
        [sys.executable, str(WORKER), "--bootstrap", kafka_bootstrap, "--redis", redis_url,
         "--prefix", key_prefix, "--topic", topic, "--mode", mode, "--recover",
         "--report", str(tmp_path / "second.txt"), "--orders", str(ORDERS)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-2000:]
    again = set((tmp_path / "second.txt").read_text().split())
    want = {message_id_for("orders", f"order-{i:06d}") for i in range(ORDERS)}
    assert again == want  # the second process saw every order guaranteed

    seen: dict[str, list[str]] = {"billing": [], "shipping": []}
    consumers = [GuardedConsumer(consumer_config(kafka_bootstrap, redis_url, [topic],
                                                 prefix=key_prefix, scope=scope,
                                                 shards=8),  # as the workers laid it out
                                 handler=lambda ctx, s=scope: seen[s].append(ctx.message_id))
                 for scope in seen]
    try:
        drain(consumers, lambda: all(len(ids) >= ORDERS for ids in seen.values()),
              timeout_s=120)
        until = time.monotonic() + 3.0  # a copy still to be read would be handled now
        drain(consumers, lambda: time.monotonic() > until)
        stats = [c.stats() for c in consumers]
    finally:
        for c in consumers:
            c.close()
    records = stats[0].polled
    for scope, ids in seen.items():
        counts = Counter(ids)
        doubled = sum(1 for n in counts.values() if n > 1)
        print(f"\n{mode} {scope}: {len(before)} guaranteed before SIGKILL, {records} records "
              f"on the topic for {ORDERS} orders, {len(counts)} handled, {doubled} twice, "
              f"{len(want - counts.keys())} missing")
        assert counts.keys() == want
        assert doubled == 0
    return records
