"""Script calls sent now, replies read later (Scripts.send_prepared / InFlight), on real Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from eoguard.envelope import now_ms
from eoguard.errors import StoreError, StoreUnavailableError
from eoguard.stack.redis_server import RedisServer
from eoguard.store.dedup import Claim, ClaimResult, DedupStore, DoneResult, position
from eoguard.store.scripts import Prepared, ScriptCall, Scripts, lua_script

pytestmark = pytest.mark.integration


def claims(store: DedupStore, n: int) -> list[Claim]:
    return [store.new_claim(str(uuid.uuid4()), position("g", "t", 0, i), now_ms() + 60_000)
            for i in range(n)]


def in_use(client: redis.Redis) -> int:
    return len(client.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def test_replies_read_after_other_work_match_a_plain_run(private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    first, second = store.new_token(), store.new_token()
    batch = claims(store, 300)
    flight = store.send([store.prepare_claim(first, batch)])
    assert in_use(client) == 1  # sent, replies not read yet
    [report] = flight.wait()
    assert report.results == [ClaimResult.NEW] * 300
    assert in_use(client) == 0
    # A batch's done marks and the next pass's claims in one round trip, run in that order.
    done, again = store.send([store.prepare_done(first, batch),
                              store.prepare_claim(second, batch)]).wait()
    assert done.results == [DoneResult.OK] * 300
    assert again.results == [ClaimResult.DONE_HERE] * 300
    [plain] = store.run([store.prepare_claim(store.new_token(), batch)])
    assert plain.results == again.results
    client.close()


def test_a_round_trip_keeps_its_order_when_one_script_is_not_loaded(
        private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    first, second = store.new_token(), store.new_token()
    batch = claims(store, 20)
    # dedup_claim loaded, dedup_done not: a round trip answered partly NOSCRIPT would run the
    # claims before the done marks resent after them. Every script is loaded before the
    # first send (Scripts.load_all), so this server holds dedup_done too.
    client.script_flush()
    client.script_load(lua_script("dedup_claim").source)
    store.claim(first, batch)
    done, again = store.send([store.prepare_done(first, batch),
                              store.prepare_claim(second, batch)]).wait()
    assert done.results == [DoneResult.OK] * 20
    assert again.results == [ClaimResult.DONE_HERE] * 20  # MINE: the claim ran first
    client.close()


def test_noscript_after_a_flush_is_loaded_and_run_again(private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    batch = claims(store, 10)
    store.claim(store.new_token(), batch)  # loads the script
    client.script_flush()
    [report] = store.send([store.prepare_claim(store.new_token(), batch)]).wait()
    assert report.results == [ClaimResult.MINE] * 10
    client.close()


def test_a_failing_call_raises_a_store_error_and_frees_the_connection(
        private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    # dedup_claim with a lease that is not a number fails inside the script.
    bad = ScriptCall("dedup_claim", ["rec", "k1"],
                     ["tok", "soon", 1_000, 1_000, 1, "rec:", 1, "pos", now_ms() + 60_000])
    store.claim(store.new_token(), claims(store, 1))  # the script is loaded
    flight = Scripts(client).send_prepared([store.prepare_claim(store.new_token(), claims(store, 2)),
                                            Prepared([bad], lambda replies: replies)])
    with pytest.raises(StoreError, match="dedup_claim"):
        flight.wait()
    assert in_use(client) == 0
    assert client.exists("k1") == 0
    client.close()


def test_unreachable_redis_is_a_typed_error_at_send(private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.address, socket_connect_timeout=1)
    store = DedupStore(client, scope="s")
    private_redis.kill()
    try:
        with pytest.raises(StoreUnavailableError):
            store.send([store.prepare_claim(store.new_token(), claims(store, 5))])
    finally:
        private_redis.start()
    client.close()
