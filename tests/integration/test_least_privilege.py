"""Producers and a consumer as a Redis ACL user with eoguard's documented rights and nothing
more (eoguard/store/acl.py): every message handled once, its effect applied once, and no
command refused but those eoguard tries and does without."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from eoguard.config import KeepUntil, ProducerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.modes import PersistenceMode
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.acl import TRIED_FIRST, acl_rules
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from tests.consumer_kit import DEFAULT_SCOPE, consumer_config, drain
from tests.redis_kit import abandoned

pytestmark = pytest.mark.integration

PER_MODE = 60
ABANDONED = 20


@dataclass(frozen=True)
class LeastUser:
    """A Redis ACL user of ``acl_rules`` on every node, and how to read its refusals."""

    url: str
    name: str
    admin: redis.Redis
    nodes: list[Any]

    def refused(self) -> list[str]:
        """The commands Redis refused this user (ACL LOG, every node)."""
        out: list[str] = []
        for node in self.nodes:
            for entry in self.admin.acl_log(**on(node)):
                if entry["username"] == self.name:
                    out += [str(entry["object"])] * int(entry["count"])
        return out


def on(node: Any) -> dict[str, Any]:
    """The keyword that sends an admin command to ``node`` (none on a single node)."""
    return {} if node is None else {"target_nodes": node}


@pytest.fixture
def least_user(redis_client: redis.Redis, redis_url: str, key_prefix: str
               ) -> Iterator[LeastUser]:
    """A fresh user of ``acl_rules(key_prefix)`` and the one effect command the handler below
    uses, on every node (replicas too), with the test Redis's URL logged in as it."""
    name, password = f"eoguard-least-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rules = [*acl_rules(key_prefix, effects=["INCRBY"]), "on", f">{password}"]
    nodes = redis_client.get_nodes() if isinstance(redis_client, RedisCluster) else [None]
    for node in nodes:
        redis_client.execute_command("ACL", "SETUSER", name, *rules, **on(node))
    scheme, rest = redis_url.split("://", 1)
    yield LeastUser(f"{scheme}://{name}:{password}@{rest}", name, redis_client, nodes)
    for node in nodes:
        redis_client.acl_deluser(name, **on(node))


@pytest.mark.cluster
def test_producers_and_a_consumer_need_no_more_than_the_documented_commands(
        kafka_bootstrap, redis_client: redis.Redis, least_user: LeastUser, key_prefix: str,
        new_topic) -> None:
    topic = new_topic(2)
    keys = KeySpace(prefix=key_prefix, shards=4)
    # Records of a producer that is gone, written as the admin: the first producer's start
    # claims and resends them (outbox_claim_for_resend.lua).
    sent = [record.id for record in abandoned(Outbox(redis_client, keys), topic,
                                              KeepUntil.CONSUMED, ABANDONED)]
    resent = 0
    for mode in PersistenceMode:
        config = ProducerConfig(kafka={"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
                                redis=RedisConfig(url=least_user.url), keyspace=keys, mode=mode,
                                keep_until=KeepUntil.CONSUMED, default_ttl_s=600)
        with GuardedProducer(config) as producer:  # recovers at start
            sent += [producer.send(topic, b"v%d" % i, key=b"k%d" % i).id
                     for i in range(PER_MODE)]
            assert producer.flush(30) == 0
            resent += producer.stats().resent
    assert resent == ABANDONED, "the first producer's start resent the gone one's records"
    handled: Counter[str] = Counter()

    def handler(ctx: HandlerContext) -> None:
        ctx.tx.incr(ctx.key_for("count"))
        handled[ctx.message_id] += 1

    consumer = GuardedConsumer(consumer_config(kafka_bootstrap, least_user.url, [topic],
                                               prefix=key_prefix, shards=4), handler=handler)
    try:
        drain([consumer], lambda: len(handled) >= len(sent))
    finally:
        consumer.close()
        outbox_left = [i for i in sent if Outbox(redis_client, keys).get(i) is not None]
        refused = Counter(least_user.refused())  # first: a refusal explains a drain cut short
        print(f"commands Redis refused the user (ACL LOG): {dict(refused)}; tried and not "
              f"needed: {TRIED_FIRST}")
    assert set(refused) <= {command.lower() for command in TRIED_FIRST}
    counters = {keys.effect(DEFAULT_SCOPE, i, "count") for i in sent}  # one a shard
    effects = sum(int(redis_client.get(key) or 0) for key in counters)
    print(f"least privilege: sent {len(sent)} ({ABANDONED} resent from a gone producer's "
          f"records), handled {sum(handled.values())} ({len(handled)} distinct), effects "
          f"applied {effects}; outbox records left {len(outbox_left)}")
    assert set(handled) == set(sent)
    assert max(handled.values()) == 1
    assert effects == len(sent)
    assert not outbox_left, "every record acknowledged by the consumer, resent ones too"


def test_a_prefix_with_glob_characters_grants_its_own_keys_only(redis_client: redis.Redis
                                                               ) -> None:
    name = f"eoguard-glob-{uuid.uuid4().hex[:8]}"
    prefix = f"t{uuid.uuid4().hex[:6]}*[ab]?\\"
    redis_client.execute_command("ACL", "SETUSER", name, *acl_rules(prefix), "on", "nopass")
    try:
        def allowed(key: str) -> bool:
            return redis_client.execute_command("ACL", "DRYRUN", name, "GET", key) == b"OK"

        others = [prefix.replace("*", "x") + ":k", prefix.replace("[ab]", "a") + ":k",
                  prefix.replace("?", "z") + ":k"]
        print(f"prefix {prefix!r}: its own key allowed {allowed(prefix + ':k')}, others "
              f"{[allowed(key) for key in others]}")
        assert allowed(prefix + ":k")
        assert not any(allowed(key) for key in others)
    finally:
        redis_client.acl_deluser(name)
