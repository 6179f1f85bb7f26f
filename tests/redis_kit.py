"""Redis helpers shared by the tests: a client of an ACL user with some commands denied, and
the outbox records of a producer that is gone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from eoguard.codec import EnvelopeCodec
from eoguard.config import KeepUntil
from eoguard.envelope import Envelope
from eoguard.store.outbox import Outbox, OutboxRecord


@contextmanager
def acl_user(admin: redis.Redis, key_prefix: str, *denied: str) -> Iterator[redis.Redis]:
    """A client of a fresh ACL user that may run every command but ``denied``."""
    user, password = f"eoguard-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"],
                      commands=["+@all", *denied], keys=[f"{key_prefix}:*"])
    kwargs = admin.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0),
                         username=user, password=password)
    try:
        yield client
    finally:
        client.close()
        admin.acl_deluser(user)


def abandoned(outbox: Outbox, topic: str, keep: KeepUntil, n: int) -> list[OutboxRecord]:
    """``n`` pending records left by a producer that is gone (it never registered a lease):
    the next producer's recovery claims and resends them."""
    codec = EnvelopeCodec()
    recs = []
    for i in range(n):
        env = Envelope.create(b"m%d" % i, ttl_ms=600_000, producer="gone")
        recs.append(OutboxRecord(id=env.id, topic=topic, key=b"k%d" % i, value=codec.encode(env),
                                 created_at_ms=env.created_at_ms, expires_at_ms=env.expires_at_ms))
    stored = outbox.put(recs, owner="gone", keep_until=keep, resend_after_ms=600_000)
    assert len(stored.stored) == n
    return recs
