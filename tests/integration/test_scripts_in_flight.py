"""Script calls sent now, replies read later (Scripts.send_prepared / InFlight), on real Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from eoguard.envelope import now_ms
from eoguard.errors import StoreError, StoreUnavailableError
from eoguard.store.dedup import Claim, ClaimResult, DedupStore, owner_token
from eoguard.store.scripts import ScriptCall, Scripts

pytestmark = pytest.mark.integration


def claims(n: int) -> list[Claim]:
    return [Claim(str(uuid.uuid4()), owner_token("s", "g", "t", 0, i), now_ms() + 60_000)
            for i in range(n)]


def in_use(client: redis.Redis) -> int:
    return len(client.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def test_replies_read_after_other_work_match_a_plain_run(private_redis) -> None:
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    batch = claims(300)
    flight = store.send([store.prepare_claim(batch)])
    assert in_use(client) == 1  # sent, replies not read yet
    [report] = flight.wait()
    assert report.results == [ClaimResult.NEW] * 300
    assert in_use(client) == 0
    [again] = store.run([store.prepare_claim(batch)])
    assert again.results == [ClaimResult.MINE] * 300
    client.close()


def test_noscript_after_a_flush_is_loaded_and_run_again(private_redis) -> None:
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    batch = claims(10)
    store.claim(batch)  # loads the script
    client.script_flush()
    [report] = store.send([store.prepare_claim(batch)]).wait()
    assert report.results == [ClaimResult.MINE] * 10
    client.close()


def test_a_failing_call_raises_a_store_error_and_frees_the_connection(private_redis) -> None:
    client = redis.Redis.from_url(private_redis.address)
    client.set("not-a-number", "x")
    store = DedupStore(client, scope="s")
    # dedup_claim with a lease that is not a number fails inside the script.
    bad = ScriptCall("dedup_claim", ["k1"], ["soon", 1, "owner", 1])
    store.claim(claims(1))  # the script is loaded
    flight = Scripts(client).send_prepared([store.prepare_claim(claims(2)),
                                            store.prepare_claim([])._replace(
                                                calls=[bad], parse=lambda r: r)])
    with pytest.raises(StoreError, match="dedup_claim"):
        flight.wait()
    assert in_use(client) == 0
    client.close()


def test_unreachable_redis_is_a_typed_error_at_send(private_redis) -> None:
    client = redis.Redis.from_url(private_redis.address, socket_connect_timeout=1)
    store = DedupStore(client, scope="s")
    private_redis.kill()
    try:
        with pytest.raises(StoreUnavailableError):
            store.send([store.prepare_claim(claims(5))])
    finally:
        private_redis.start()
    client.close()
