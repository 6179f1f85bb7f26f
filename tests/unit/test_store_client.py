"""eoguard.store.client without a server: the error mapping and what connect() decides alone."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import OutOfMemoryError

from eoguard.config import RedisConfig
from eoguard.errors import StoreError, StoreOutOfMemoryError, StoreUnavailableError
from eoguard.store.client import connect, wrap_redis_error


@pytest.mark.parametrize("exc", [
    OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.ResponseError("Error running script (call to f_1): @user_script:9: "
                        "OOM command not allowed when used memory > 'maxmemory'."),
])
def test_a_full_redis_is_a_typed_error(exc: Exception) -> None:
    wrapped = wrap_redis_error(exc, "writing the outbox")
    assert isinstance(wrapped, StoreOutOfMemoryError)
    assert isinstance(wrapped, StoreError)
    assert "out of memory" in str(wrapped)


def test_cluster_false_builds_a_single_node_client_without_asking() -> None:
    client = connect("redis://127.0.0.1:1/0", cluster=False)
    assert type(client) is redis.Redis  # nothing was sent: port 1 answers nobody
    client.close()


def test_asking_an_unreachable_server_is_unavailable() -> None:
    config = RedisConfig(url="redis://127.0.0.1:1/0", connect_timeout_s=0.2,
                         options={"retry": None})
    with pytest.raises(StoreUnavailableError, match="cluster mode"):
        config.connect()
