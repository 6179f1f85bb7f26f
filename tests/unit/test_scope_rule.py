"""One rule for a consumer scope (``eoguard.store.keys.check_scope``), one error for breaking it.

A scope that cannot name keys is bad input (:class:`ConfigError`, an InvalidInputError: the
same call fails again), never a StoreError (an UnavailableError: "retry later"), whoever takes
it: the dedup store, a consumer's configuration, the Spark job's options and its executors'
claim settings. No Redis is reached: the scope is checked before the client is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.errors import ConfigError, InvalidInputError, UnavailableError
from eoguard.store.dedup import DedupStore
from eoguard.store.keys import check_scope
from eoguard_spark.options import JobOptions
from eoguard_spark.worker import ClaimSettings

BAD_SCOPES = ["", "a|b", "{billing}", "bill{ing", "billing}"]
UNREACHABLE = redis.Redis(port=1)  # never connected: construction sends no command


def dedup_store(scope: str) -> object:
    return DedupStore(UNREACHABLE, scope=scope)


def consumer_config(scope: str) -> object:
    return ConsumerConfig(kafka={"bootstrap.servers": "k:9092", "group.id": "g"},
                          redis=RedisConfig(url="redis://r:6379/0"), scope=scope,
                          topics=("orders",))


def job_options(scope: str) -> object:
    return JobOptions(bootstrap="k:9092", topics=("t",), scope=scope, checkpoint="/tmp/cp",
                      output_path="/tmp/out")


def spark_claims(scope: str) -> object:
    settings = ClaimSettings(redis_url="redis://r:6379/0", key_prefix="eog", key_shards=16,
                             max_ttl_ms=60_000, scope=scope, lease_ms=1_000, grace_ms=1_000,
                             busy_wait_ms=0, batch_size=10, ack_outbox=False)
    return settings.store(UNREACHABLE)


TAKERS: dict[str, Callable[[str], Any]] = {
    "DedupStore": dedup_store, "ConsumerConfig": consumer_config,
    "JobOptions": job_options, "ClaimSettings.store": spark_claims,
}


@pytest.mark.parametrize("scope", BAD_SCOPES)
@pytest.mark.parametrize("taker", TAKERS)
def test_a_bad_scope_is_bad_input_wherever_it_is_given(taker: str, scope: str) -> None:
    with pytest.raises(ConfigError, match="must be non-empty, without") as caught:
        TAKERS[taker](scope)
    assert isinstance(caught.value, InvalidInputError)
    assert not isinstance(caught.value, UnavailableError)  # a retry would fail the same way


@pytest.mark.parametrize("taker", TAKERS)
def test_a_good_scope_is_taken_as_given(taker: str) -> None:
    TAKERS[taker]("billing/eu-1.v2")
    assert check_scope("billing/eu-1.v2") == "billing/eu-1.v2"
