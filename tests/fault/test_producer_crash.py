"""A producer SIGKILLed after guaranteeing messages: recovery gets every one of them to Kafka,
and two producers recovering at once never both resend a record."""

from __future__ import annotations

import random
import time

import pytest
import redis

from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from tests.fault.producer_fault_kit import (
    ProducerWorker,
    read_topic,
    recover_concurrently,
    recovering_config,
)

pytestmark = pytest.mark.fault


@pytest.mark.parametrize(("mode", "delay_ms"), [("persist-first", 0), ("delayed", 0),
                                               ("delayed", 2)])
def test_killed_producer_loses_no_guaranteed_message(mode, delay_ms, tmp_path, kafka_bootstrap,
                                                     redis_url, key_prefix, new_topic) -> None:
    """``delayed`` with a 2 ms delay persists most messages before Kafka acknowledges them,
    so the kill leaves delayed-mode records in the outbox for recovery."""
    topic = new_topic()
    worker = ProducerWorker(tmp_path, bootstrap=kafka_bootstrap, redis_url=redis_url,
                            prefix=key_prefix, topic=topic, mode=mode, delay_ms=delay_ms)
    guaranteed = set(worker.kill_after(random.randint(2_000, 8_000)))
    client = redis.Redis.from_url(redis_url)
    outbox = Outbox(client, KeySpace(prefix=key_prefix, shards=8))
    left = {i for ids in outbox.pending_ids().values() for i in ids}
    time.sleep(2.0)  # the dead worker's 1.5 s liveness lease lapses

    cfg = recovering_config(kafka_bootstrap, redis_url, key_prefix)
    resent = recover_concurrently([cfg, cfg])
    seen, resends = read_topic(kafka_bootstrap, topic, expect_ids=guaranteed)

    missing = guaranteed - seen.keys()
    doubled = {i: n for i, n in resends.items() if n > 1}
    print(f"\n{mode} (delay {delay_ms or 'adaptive'}): {len(guaranteed)} guaranteed before "
          f"SIGKILL, {len(left)} pending in the outbox, resent {resent[0]} + {resent[1]} "
          f"by two concurrent recoverers; "
          f"{len(seen)} distinct ids on the topic; {len(missing)} guaranteed missing; "
          f"{len(doubled)} ids resent twice")
    assert not missing
    assert not doubled  # ownership is taken atomically: one resend per record at most
    assert sum(resent) == sum(resends.values()) == len(left)
    assert outbox.pending_ids() == {}  # nothing left to resend
    client.close()
