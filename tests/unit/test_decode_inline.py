"""The consumer's decode builds each claim's position, shard and key inline (hot path): pinned
here to their definitions, :func:`eoguard.store.dedup.position`, :meth:`KeySpace.shard_of` and
:meth:`KeySpace.dedup`, over the vectors the Spark job's columns are pinned with
(tests/claim_vectors.py), plus random ids, partitions and offsets."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.batch import BatchProcessor
from eoguard.consumer.dead_letter import DeadLetterRouter
from eoguard.consumer.handler import ContextEnv
from eoguard.consumer.leases import BatchLeases
from eoguard.stack.feed import envelope
from eoguard.store.dedup import DedupStore, parse_position, position
from eoguard.store.keys import KeySpace
from tests.claim_vectors import READERS, SHARDS, TOPICS, partition_offsets, uuid_ids
from tests.consumer_kit import Record

CODEC = EnvelopeCodec()


class Sink:
    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing here is dead-lettered")

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def processor(group: str, keys: KeySpace, leases: list[BatchLeases]) -> BatchProcessor:
    config = ConsumerConfig(kafka={"bootstrap.servers": "unused:9092", "group.id": group},
                            redis=RedisConfig(url="redis://127.0.0.1:1/0"), scope="app",
                            topics=("t",), keyspace=keys)
    store = DedupStore(redis.Redis(port=1), scope="app", keys=keys)  # never connected
    lease = BatchLeases(store, interval_s=3600, max_hold_s=3600)
    leases.append(lease)
    sink: Any = Sink()
    return BatchProcessor(config, dedup=store, outbox=None, sink=sink,
                          dead=DeadLetterRouter(sink, topic="dlq", scope="app"),
                          env=ContextEnv("app", keys, False, "unit", CODEC, PayloadCodec()),
                          leases=lease, send=lambda prepared: lambda: [],
                          handler=lambda ctx: None, batch_handler=None)


@pytest.fixture
def leases() -> Any:
    made: list[BatchLeases] = []
    yield made
    for lease in made:
        lease.close()


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("group", READERS[:3])  # a consumer's group.id is never empty
def test_decode_builds_positions_shards_and_keys_as_their_definitions(
        leases: list[BatchLeases], group: str, shards: int) -> None:
    keys = KeySpace(prefix="unit", shards=shards)
    batches = processor(group, keys, leases)
    pairs = partition_offsets(300, seed=shards)
    ids = uuid_ids(len(pairs) * len(TOPICS), seed=shards)
    # Upper-case UUIDs are normalised by the input rules before any key is built.
    ids[::7] = [i.upper() for i in ids[::7]]
    records = []
    for n, (topic, (partition, offset)) in enumerate(
            (t, pair) for t in TOPICS for pair in pairs):
        value = CODEC.encode(envelope(b"m", message_id=ids[n]))
        records.append(Record(offset, value, partition, topic))

    batch = batches.decode(records)  # type: ignore[arg-type]

    assert len(batch.items) == len(records)  # every record decoded: the check cannot pass empty
    for record, item in zip(records, batch.items, strict=True):
        claim = item.claim
        where = position(group, record.topic(), record.partition(), record.offset())
        assert claim.message_id == item.envelope.id
        assert claim.position == where
        assert parse_position(claim.position) == (group, record.topic(), record.partition(),
                                                   record.offset())
        assert claim.shard == keys.shard_of(claim.message_id)
        assert claim.key == keys.dedup("app", claim.message_id)
        assert claim.expires_at_ms == item.envelope.expires_at_ms
    used = {item.claim.shard for item in batch.items}
    assert len(used) > min(shards - 1, 1)  # not one constant: the check can fail
