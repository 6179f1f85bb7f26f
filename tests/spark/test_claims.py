"""The executors' claim and done passes against real Redis, without Spark: which copy of an id
wins, how claims held elsewhere are settled, and that the done pass completes only ours."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.dedup import Claim, DedupState, DedupStore, DoneResult, owner_token
from eoguard.store.keys import KeySpace
from eoguard_spark.claims import claim_partition
from eoguard_spark.worker import ClaimSettings, done_partition

pytestmark = pytest.mark.integration

SCOPE, READER, TOPIC = "app", "spark-0123456789ab", "orders"


def settings(redis_url: str, key_prefix: str, **overrides: int) -> ClaimSettings:
    values = {"lease_ms": 60_000, "grace_ms": 60_000, "busy_wait_ms": 0, "batch_size": 3}
    values.update(overrides)
    return ClaimSettings(redis_url=redis_url, key_prefix=key_prefix, key_shards=4, scope=SCOPE,
                         ack_outbox=True, **values)


def rows(ids: list[str], offsets: list[int], status: list[str] | None = None
         ) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    expires = now_ms() + 600_000
    return (pa.array(ids), pa.array([owner_token(SCOPE, READER, TOPIC, 0, o) for o in offsets]),
            pa.array([expires] * len(ids), pa.int64()),
            pa.array(status or ["ok"] * len(ids)))


def store(redis_client: redis.Redis, key_prefix: str) -> DedupStore:
    return DedupStore(redis_client, scope=SCOPE, keys=KeySpace(prefix=key_prefix, shards=4),
                      lease_ms=600_000)


def test_copies_held_by_this_query_are_duplicates_others_wait(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    a, b, c, d, e = (new_message_id() for _ in range(5))
    dedup = store(redis_client, key_prefix)
    expires = now_ms() + 600_000
    dedup.claim([
        Claim(b, owner_token(SCOPE, READER, TOPIC, 1, 50), expires),  # a copy elsewhere in the batch
        Claim(c, owner_token(SCOPE, "a-group", TOPIC, 0, 7), expires),  # a consumer, mid-handling
        Claim(d, owner_token(SCOPE, "a-group", TOPIC, 0, 8), expires),
    ])
    dedup.done([Claim(d, owner_token(SCOPE, "a-group", TOPIC, 0, 8), expires)])
    # Two input batches: a copy of `a` in the second one is found by the partition itself.
    batches = [rows([a, b, c, d], [0, 1, 2, 3]), rows([a, e, "x"], [4, 5, 6], ["ok", "ok", "malformed"])]

    out = [arr.to_pylist() for arr in claim_partition(settings(redis_url, key_prefix), iter(batches))]

    assert out == [["new", "duplicate", "busy", "duplicate"], ["duplicate", "new", "malformed"]]
    entry = dedup.check(c)
    assert entry is not None
    assert entry.state is DedupState.CLAIMED  # the consumer's claim is left alone
    assert entry.owner == owner_token(SCOPE, "a-group", TOPIC, 0, 7)


def test_a_busy_claim_is_taken_over_once_its_lease_lapses(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    message = new_message_id()
    short = DedupStore(redis_client, scope=SCOPE, keys=KeySpace(prefix=key_prefix, shards=4),
                       lease_ms=300)
    short.claim([Claim(message, owner_token(SCOPE, "a-group", TOPIC, 0, 9), now_ms() + 600_000)])

    [out] = claim_partition(settings(redis_url, key_prefix, busy_wait_ms=3_000),
                            iter([rows([message], [0])]))

    assert out.to_pylist() == ["taken_over"]


def test_done_pass_marks_only_this_querys_claims(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    ids = [new_message_id() for _ in range(7)]
    conf = settings(redis_url, key_prefix)
    list(claim_partition(conf, iter([rows(ids[:6], list(range(6)))])))
    ours = rows(ids, list(range(7)))  # the 7th was never claimed: ABSENT, not marked
    batch = pa.RecordBatch.from_arrays([ours[0], ours[1], ours[2]],
                                       ["id", "owner", "expires_at_ms"])

    counts = done_partition(conf, iter([batch]))
    again = done_partition(conf, iter([batch]))

    assert counts == Counter({DoneResult.OK: 6, DoneResult.ABSENT: 1})
    assert again == Counter({DoneResult.ALREADY_DONE: 6, DoneResult.ABSENT: 1})
    entry = store(redis_client, key_prefix).check(ids[0])
    assert entry is not None
    assert entry.state is DedupState.DONE
