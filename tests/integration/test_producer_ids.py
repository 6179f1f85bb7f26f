"""Application-supplied ids and the send-time input rules, on real Kafka and Redis."""

from __future__ import annotations

import pytest

from eoguard import InvalidMessageError, message_id_for
from eoguard.config import PersistenceMode
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from tests.integration.test_producer import Recorder, consume, make_config

pytestmark = pytest.mark.integration


def test_a_repeated_id_is_guaranteed_twice_and_published_once(kafka_bootstrap, redis_url,
                                                               key_prefix, new_topic) -> None:
    topic = new_topic(1)
    rec = Recorder()
    ids = [message_id_for("orders", f"o-{i}") for i in range(20)]
    with GuardedProducer(make_config(kafka_bootstrap, redis_url, key_prefix),
                         on_guaranteed=rec.on_guaranteed, on_failed=rec.on_failed) as producer:
        first = [producer.send(topic, b"v1", message_id=i) for i in ids]
        assert all(h.wait(30) for h in first)
        # The same orders again, the id spelled another way for half of them.
        again = [producer.send(topic, b"v2", message_id=i.upper() if n % 2 else i)
                 for n, i in enumerate(ids)]
        assert all(h.wait(30) for h in again)
        assert [h.id for h in again] == ids  # normalised
        stats = producer.stats()
    assert rec.guaranteed == dict.fromkeys(ids, 2)
    assert stats.already_in_outbox == len(ids)
    records = consume(kafka_bootstrap, topic, expect=len(ids))
    assert sorted(env.id for _, env in records) == sorted(ids)  # each published once
    assert {env.payload for _, env in records} == {b"v1"}


def test_the_same_id_twice_in_one_batch_is_published_once(kafka_bootstrap, redis_url,
                                                          key_prefix, new_topic) -> None:
    topic = new_topic(1)
    ids = [message_id_for("orders", f"batch-{i}") for i in range(50)]
    with GuardedProducer(make_config(kafka_bootstrap, redis_url, key_prefix)) as producer:
        handles = [producer.send(topic, b"v", message_id=i) for i in ids for _ in range(2)]
        assert all(h.wait(30) for h in handles)
        stats = producer.stats()
    assert stats.already_in_outbox == len(ids)
    assert stats.persisted == len(ids)
    records = consume(kafka_bootstrap, topic, expect=len(ids))
    assert sorted(env.id for _, env in records) == sorted(ids)  # each once, none lost


def test_send_refuses_what_a_consumer_would_refuse(kafka_bootstrap, redis_url, key_prefix,
                                                   new_topic) -> None:
    topic = new_topic(1)
    config = make_config(kafka_bootstrap, redis_url, key_prefix,
                         keyspace=KeySpace(prefix=key_prefix, shards=8, max_ttl_ms=3_600_000),
                         mode=PersistenceMode.DELAYED)
    with GuardedProducer(config) as producer:
        with pytest.raises(InvalidMessageError, match="exceeds the key prefix's max_ttl_ms"):
            producer.send(topic, b"x", ttl_s=3_601)
        with pytest.raises(InvalidMessageError, match="message_id must be a UUID"):
            producer.send(topic, b"x", message_id="order-17")
        with pytest.raises(InvalidMessageError, match="exceed input_limits"):
            producer.send(topic, b"x", headers={f"h{i}": "v" for i in range(65)})
        assert producer.send(topic, b"x", ttl_s=3_600).wait(30)
