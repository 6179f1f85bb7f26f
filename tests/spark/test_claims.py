"""The executors' claim and acknowledgement passes and the driver's done mark against real
Redis, without Spark: which copy of an id wins, how claims held elsewhere are settled, what a
replay of a done micro-batch keeps, and that the done mark completes only this batch's claims."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest
import redis

from eoguard.envelope import new_message_id, now_ms
from eoguard.modes import KeepUntil
from eoguard.store.dedup import BatchState, Claim, ClaimResult, DedupStore, IdState, position
from eoguard.store.keys import DEFAULT_MAX_TTL_MS, KeySpace
from eoguard.store.outbox import Outbox, OutboxRecord
from eoguard.store.scripts import Prepared
from eoguard_spark.claims import ClaimInput, claim_partition
from eoguard_spark.dedup import batch_token
from eoguard_spark.worker import IN_FLIGHT, ClaimSettings, ack_partition, in_flight

pytestmark = pytest.mark.integration

SCOPE, READER, TOPIC = "app", "spark-0123456789ab", "orders"
TOKEN = batch_token(READER, "6f1c0d2e-query", 7)


def settings(redis_url: str, key_prefix: str, **overrides: Any) -> ClaimSettings:
    values: dict[str, Any] = {"lease_ms": 60_000, "grace_ms": 60_000, "busy_wait_ms": 0,
                                 "batch_size": 3, "key_shards": 4, "token": TOKEN,
                                 "max_ttl_ms": DEFAULT_MAX_TTL_MS}
    values.update(overrides)
    return ClaimSettings(redis_url=redis_url, key_prefix=key_prefix, scope=SCOPE,
                         ack_outbox=True, **values)


def at(offset: int, reader: str = READER, partition: int = 0) -> str:
    return position(reader, TOPIC, partition, offset)


def rows(ids: list[str], offsets: list[int], status: list[str] | None = None
         ) -> ClaimInput:
    """A claim pass's input batch; shards as the default ``settings`` (4) place the ids."""
    expires = now_ms() + 600_000
    return (pa.array(ids), pa.array([at(o) for o in offsets]),
            pa.array([expires] * len(ids), pa.int64()),
            pa.array(status or ["ok"] * len(ids)),
            pa.array([KeySpace(shards=4).shard_of(i) for i in ids], pa.int64()))


def store(redis_client: redis.Redis, key_prefix: str, *, shards: int = 4,
          lease_ms: int = 600_000) -> DedupStore:
    return DedupStore(redis_client, scope=SCOPE, keys=KeySpace(prefix=key_prefix, shards=shards),
                      lease_ms=lease_ms)


def claim(conf: ClaimSettings, *batches: ClaimInput) -> list[list[str]]:
    return [arr.to_pylist() for arr in claim_partition(conf, iter(batches))]


def test_the_batch_token_is_stable_and_tells_batches_readers_and_queries_apart() -> None:
    token = batch_token("r", "q", 3)
    assert token == batch_token("r", "q", 3)
    assert len(token) == 16
    assert int(token, 16) >= 0  # hex digits: never a '|'
    others = {batch_token("r", "q", 4), batch_token("r2", "q", 3), batch_token("r", "q2", 3),
              batch_token("r|q", "", 3), batch_token("", "r|q", 3)}
    assert token not in others
    assert len(others) == 5


def test_copies_held_by_this_batch_are_duplicates_others_wait(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    a, b, c, d, e = (new_message_id() for _ in range(5))
    dedup = store(redis_client, key_prefix)
    expires = now_ms() + 600_000
    dedup.claim(TOKEN, [Claim(b, at(50, partition=1), expires)])  # a copy elsewhere in the batch
    dedup.claim("consumer-batch-1", [Claim(c, at(7, "a-group"), expires)])  # mid-handling
    held_d = Claim(d, at(8, "a-group"), expires)
    dedup.claim("consumer-batch-2", [held_d])
    dedup.done("consumer-batch-2", [held_d])
    # Two input batches: a copy of `a` in the second one is found by the partition itself.
    batches = [rows([a, b, c, d], [0, 1, 2, 3]),
               rows([a, e, "x"], [4, 5, 6], ["ok", "ok", "malformed"])]

    out = claim(settings(redis_url, key_prefix), *batches)

    assert out == [["new", "duplicate", "busy", "duplicate"], ["duplicate", "new", "malformed"]]
    entry = dedup.check(c)
    assert entry is not None
    assert (entry.token, entry.position) == ("consumer-batch-1", at(7, "a-group"))  # left alone
    entry = dedup.check(b)
    assert entry is not None
    assert (entry.token, entry.position) == (TOKEN, at(50, partition=1))  # the batch's own copy


def test_claims_live_to_expiry_plus_grace_under_the_prefixs_own_max_ttl(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    # A prefix laid out with a max_ttl beyond the default (30 days): a claim of a message
    # expiring in 60 days must not be clamped to the default, or a copy read after day 30
    # would find no claim and be handled again.
    day = 86_400_000
    conf = settings(redis_url, key_prefix, max_ttl_ms=90 * day)
    message = new_message_id()
    expires = now_ms() + 60 * day
    out = claim(conf, (pa.array([message]), pa.array([at(0)]), pa.array([expires], pa.int64()),
                       pa.array(["ok"]), pa.array([KeySpace(shards=4).shard_of(message)])))
    assert out == [["new"]]
    key = KeySpace(prefix=key_prefix, shards=4).dedup(SCOPE, message)
    assert redis_client.pexpiretime(key) == expires + conf.grace_ms


def test_a_busy_claim_is_taken_over_once_its_lease_lapses(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    message = new_message_id()
    store(redis_client, key_prefix, lease_ms=300).claim(
        "consumer-batch", [Claim(message, at(9, "a-group"), now_ms() + 600_000)])

    [out] = claim(settings(redis_url, key_prefix, busy_wait_ms=3_000), rows([message], [0]))

    assert out == ["new"]
    entry = store(redis_client, key_prefix).check(message)
    assert entry is not None
    assert (entry.token, entry.position) == (TOKEN, at(0))


def test_a_replay_of_a_done_batch_keeps_its_rows_and_leaves_out_what_it_did_not_take(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    """The first run claimed a and b and its done mark landed; the replay (same token, same
    positions) keeps both as DONE_HERE. c and f were not ours the first time (BUSY elsewhere,
    released since): c shares a shard with a done record of the batch (the script answers
    STALE), f lies on a shard the batch never claimed on (the claim comes back NEW, so the
    executor releases it). Both are left out, with no claim of the batch left behind."""
    keys = KeySpace(prefix=key_prefix, shards=4)
    a, b = new_message_id(), new_message_id()
    taken = {keys.shard_of(a), keys.shard_of(b)}
    c = next(i for i in iter(new_message_id, "") if keys.shard_of(i) in taken)
    f = next(i for i in iter(new_message_id, "") if keys.shard_of(i) not in taken)
    conf = settings(redis_url, key_prefix)
    assert claim(conf, rows([a, b], [0, 1])) == [["new", "new"]]
    dedup = store(redis_client, key_prefix)
    dedup.mark_done(TOKEN)
    records = dedup.batch_records(TOKEN)
    assert sorted(s for s, r in enumerate(records) if r is not None) == sorted(taken)
    assert all(r.state is BatchState.DONE for r in records if r is not None)

    replay = claim(settings(redis_url, key_prefix, token_done=True),
                   rows([a, b, c, f], [0, 1, 2, 3]))
    # Another claim pass of this reader over the same records (another query under the same
    # reader name) finds them done by another batch: duplicates, not its rows.
    other = claim(settings(redis_url, key_prefix, token=batch_token(READER, "other", 7)),
                  rows([a, b], [0, 1]))

    print(f"replay statuses={replay} other pass={other}")
    assert replay == [["done_here", "done_here", "stale", "stale"]]
    assert other == [["duplicate", "duplicate"]]
    assert dedup.check(c) is None
    assert dedup.check(f) is None  # released: the batch keeps no claim it did not use
    for message in (a, b):
        entry = dedup.check(message)
        assert entry is not None
        assert entry.token == TOKEN
        assert entry.id_state(now_ms()) is IdState.DONE


def test_the_done_mark_completes_only_this_batchs_claims_and_acks_the_outbox(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    ids = [new_message_id() for _ in range(7)]
    conf = settings(redis_url, key_prefix)
    assert claim(conf, rows(ids[:6], list(range(6)))) == [["new"] * 6]
    dedup = store(redis_client, key_prefix)
    expires = now_ms() + 600_000
    dedup.claim("consumer-batch", [Claim(ids[6], at(9, "a-group"), expires)])
    outbox = Outbox(redis_client, KeySpace(prefix=key_prefix, shards=4))
    stored = outbox.put([OutboxRecord(id=i, topic=TOPIC, key=None, value=b"v",
                                      created_at_ms=now_ms(), expires_at_ms=expires)
                         for i in ids[:4]], owner="p1", keep_until=KeepUntil.CONSUMED,
                        resend_after_ms=60_000)
    assert len(stored.stored) == 4

    before = dedup.batch_records(TOKEN)
    dedup.mark_done(TOKEN)
    after = dedup.batch_records(TOKEN)
    dedup.mark_done(TOKEN)  # again (a replay): nothing changes
    acked = ack_partition(conf, iter([pa.RecordBatch.from_pydict({"id": ids[:6]})]))

    opened = [r for r in before if r is not None]
    print(f"records open before={len(opened)} done after="
          f"{sum(r is not None and r.state is BatchState.DONE for r in after)} acked={acked}")
    assert opened
    assert all(r.state is BatchState.OPEN for r in opened)
    assert [r is None for r in after] == [r is None for r in before]
    assert all(r.state is BatchState.DONE for r in after if r is not None)
    assert dedup.batch_records(TOKEN) == after
    now = now_ms()
    for message in ids[:6]:
        entry = dedup.check(message)
        assert entry is not None
        assert entry.id_state(now) is IdState.DONE
    other = dedup.check(ids[6])
    assert other is not None
    assert other.id_state(now) is IdState.IN_PROGRESS  # another batch's claim: not ours to mark
    assert acked == 4
    assert all(outbox.get(i) is None for i in ids[:4])


def test_round_trips_left_in_flight_are_given_back_unread(private_redis: Any) -> None:
    """``in_flight`` keeps up to IN_FLIGHT round trips out, each on a connection of its own. A
    caller that stops early, or a reply that fails, leaves no connection checked out and none
    whose unread replies would answer its next user."""
    client = redis.Redis.from_url(private_redis.address)
    store = DedupStore(client, scope="s")
    pool = client.connection_pool

    def chunk() -> Prepared[Any]:
        batch = [store.new_claim(new_message_id(), position("r", "t", 0, i), now_ms() + 60_000)
                 for i in range(50)]
        return store.prepare_claim(store.new_token(), batch)

    def boom(_replies: list[Any]) -> Any:
        raise RuntimeError("a reply that fails to parse")

    with ThreadPoolExecutor(1) as threads:
        replies = in_flight(store, [chunk() for _ in range(IN_FLIGHT + 2)], "claiming", threads)
        first = next(replies)
        out_early = len(pool._in_use_connections)  # type: ignore[attr-defined]
        replies.close()
        after_close = len(pool._in_use_connections)  # type: ignore[attr-defined]
        failing = [chunk(), Prepared(chunk().calls, boom), chunk(), chunk()]
        with pytest.raises(RuntimeError, match="fails to parse"):
            list(in_flight(store, failing, "claiming", threads))
        after_error = len(pool._in_use_connections)  # type: ignore[attr-defined]
    [next_user] = store.run([chunk()])
    print(f"in use: {out_early} after the first reply, {after_close} after close, "
          f"{after_error} after a failed reply; the next user got {len(next_user.results)} "
          f"replies")
    assert first.results == [ClaimResult.NEW] * 50
    assert out_early == IN_FLIGHT - 1
    assert after_close == after_error == 0
    assert next_user.results == [ClaimResult.NEW] * 50
    client.close()
