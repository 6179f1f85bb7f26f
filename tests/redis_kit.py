"""Redis helpers shared by the tests: a client of an ACL user with some commands denied."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis


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
