"""A transactional handler whose effects fail midway (PARTIAL): dead-lettered, never re-applied.

The effect check in ``dedup_done.lua`` refuses what would fail before anything is written; what
it cannot foresee (here: an ACL that forbids SADD) fails after earlier effects were applied.
Redis cannot roll those back, so the message is marked done and the consumer dead-letters it
with the reason instead of retrying (a retry would apply the first effect again).
"""

from __future__ import annotations

import pytest
import redis

from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import Claim, ClaimResult, DedupStore, DoneResult, Effect, position
from eoguard.store.keys import KeySpace
from tests.consumer_kit import CODEC, consumer_config, drain, headers_of, read_all

pytestmark = pytest.mark.integration


@pytest.mark.denied("-sadd")  # the consumer reads its key layout with HGET
def test_partial_effects_are_dead_lettered_once_and_the_rest_handled(
        limited_client: redis.Redis, redis_client: redis.Redis, kafka_bootstrap: str,
        redis_url: str, key_prefix: str, new_topic) -> None:
    topic, dead = new_topic(1), new_topic(1, prefix="dlq")
    envs = [envelope(b"m%d" % i) for i in range(10)]
    poison = envs[4].id
    produce(kafka_bootstrap, topic, envs)
    counters: dict[str, str] = {}

    def handler(ctx: HandlerContext) -> None:
        counters[ctx.message_id] = ctx.key_for(f"count:{ctx.message_id}")
        ctx.tx.incr(counters[ctx.message_id])
        if ctx.message_id == poison:
            ctx.tx.sadd(ctx.key_for("tags"), "x")  # refused by the ACL, after the INCR

    config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                             dead_letter_topic=dead, ack_outbox=False)
    consumer = GuardedConsumer(config, handler=handler, redis=limited_client)
    try:
        drain([consumer], lambda: consumer.stats().handled + consumer.stats().partial_effects
              >= len(envs))
        stats = consumer.stats()
    finally:
        consumer.close()
    letters = read_all(kafka_bootstrap, dead, 1)
    print(f"handled={stats.handled} partial={stats.partial_effects} retries={stats.retries} "
          f"dead letters={len(letters)}")
    assert (stats.handled, stats.partial_effects, stats.retries) == (9, 1, 0)
    assert len(letters) == 1
    headers = headers_of(letters[0])
    assert letters[0].value() == CODEC.encode(envs[4])
    assert "partial-effects" in headers.values()
    assert any("SADD" in value for value in headers.values())
    # Every counter once, the poison's included: its INCR was applied once and never again.
    assert {mid: redis_client.get(key) for mid, key in counters.items()} == \
        {e.id: b"1" for e in envs}


@pytest.mark.denied("-sadd")
def test_a_partial_whose_dead_letter_was_lost_is_dead_lettered_on_re_read(
        limited_client: redis.Redis, redis_client: redis.Redis, kafka_bootstrap: str,
        redis_url: str, key_prefix: str, new_topic) -> None:
    # A consumer of group g marked record 0 PARTIAL and died before its dead letter was sent
    # (nor its offset committed). The next consumer of g re-reads record 0: it must dead-letter
    # it without running the handler; another group's consumer of the scope skips it as DONE.
    topic, dead = new_topic(1), new_topic(1, prefix="dlq")
    envs = [envelope(b"m%d" % i) for i in range(3)]
    produce(kafka_bootstrap, topic, envs)
    group = f"g-{key_prefix}"
    store = DedupStore(limited_client, scope="app", keys=KeySpace(prefix=key_prefix))
    claim = Claim(envs[0].id, position(group, topic, 0, 0), envs[0].expires_at_ms)
    token = store.new_token()
    assert store.claim(token, [claim])[0].result is ClaimResult.NEW
    effects = {envs[0].id: [Effect("INCRBY", store.effect_key(envs[0].id, "n"), (1,)),
                            Effect("SADD", store.effect_key(envs[0].id, "s"), ("x",))]}
    assert store.done(token, [claim], effects=effects)[0].result is DoneResult.PARTIAL
    seen: dict[str, list[str]] = {group: [], "other": []}
    for name, handled_here in seen.items():
        config = consumer_config(kafka_bootstrap, redis_url, [topic], prefix=key_prefix,
                                 group=group if name == group else f"other-{key_prefix}",
                                 dead_letter_topic=dead, ack_outbox=False)
        consumer = GuardedConsumer(config, handler=lambda ctx, out=handled_here:
                                   out.append(ctx.message_id))
        try:
            drain([consumer], lambda c=consumer: c.stats().polled >= len(envs))
            stats = consumer.stats()
        finally:
            consumer.close()
        print(f"{name}: handled={stats.handled} partial={stats.partial_effects} "
              f"duplicates={stats.duplicates}")
        if name == group:
            assert (stats.handled, stats.partial_effects) == (2, 1)
        else:
            assert (stats.handled, stats.partial_effects, stats.duplicates) == (0, 0, 3)
    assert seen == {group: [envs[1].id, envs[2].id], "other": []}
    letters = read_all(kafka_bootstrap, dead, 1)
    assert [CODEC.decode(m.value()).id for m in letters] == [envs[0].id]
    assert redis_client.get(store.effect_key(envs[0].id, "n")) == b"1"  # never re-applied
