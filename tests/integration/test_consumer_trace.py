"""Trace mode on the real stack: every message handled is traced once, its stamps in stage
order; with tracing off nothing is kept. No timings are asserted: the machine may be busy."""

from __future__ import annotations

from collections import Counter

import pytest

from eoguard.stack.feed import envelope, produce
from tests.consumer_kit import drain, recorder

pytestmark = pytest.mark.integration

COUNT = 300


def test_a_traced_consumer_stamps_every_message_in_stage_order(make, new_topic,
                                                                kafka_bootstrap) -> None:
    topic = new_topic(2)
    envs = [envelope(b"m%d" % i) for i in range(COUNT)]
    produce(kafka_bootstrap, topic, envs)
    seen, handler = recorder()
    # Small batches: many of them, through the overlapped timeline and the light one.
    traced = make([topic], handler, batch_size=20, trace_messages=COUNT)
    drain([traced], lambda: len(seen) >= COUNT)
    traced.close()  # the round trips in flight land: every batch handled is committed
    records = traced.trace()
    assert Counter(r.message_id for r in records) == Counter(e.id for e in envs)
    created = {e.id: e.created_at_ms for e in envs}
    batches = set()
    for rec in records:
        assert rec.created_at_ms == created[rec.message_id]
        stamps = rec.stamps_ns()
        assert len(stamps) == 7
        assert all(stamps), rec  # read, claims sent and landed, handled, done sent and
        assert list(stamps) == sorted(stamps), rec  # landed, committed: each one, in order
        batches.add(stamps)
    assert 1 < len(batches) <= COUNT  # a batch's messages share its stamps

    again, plain_handler = recorder()
    # A scope of its own (the first one's would find every message a duplicate).
    untraced = make([topic], plain_handler, batch_size=20, scope="untraced")
    drain([untraced], lambda: len(again) >= COUNT)
    untraced.close()
    assert untraced.config.trace_messages == 0
    assert untraced.trace() == []
