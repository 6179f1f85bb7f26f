"""Two attempts of one Spark task, then the driver's done mark, against real Redis and the real
claim pass (:func:`eoguard_spark.claims.claim_partition`), without a SparkSession.

The driver marks a micro-batch done with one call covering every claim that still names its
token (``DedupStore.mark_done``, as ``MicroBatchRunner._mark_done`` does), so every attempt of
a task must leave the same claims under the token. Claims an attempt made do (the next attempt finds
them MINE); a BUSY claim does not: its answer changes when the holder lets go. The committed
attempt S1 gave up a row the scope's GuardedConsumer held; the consumer let it go; a later
attempt S2 (speculative, or on an executor Spark gave up on) took it under the token, and its
output is thrown away. The done mark must not make that row DUPLICATE for the consumer, and an
attempt claiming after the done mark must leave no open claim behind.

Each test checks, for every id of the task's input, that exactly one of these holds:
- it is in the committed attempt's output (status ``new`` or ``mine``);
- the consumer scope can still handle it (a fresh consumer pass at its consumer position, the
  same record as the consumer group reads it, claims it NEW or MINE);
- the consumer handled it (done) elsewhere;
and that no batch record of the token is left open after the done mark. Only outcomes are
asserted: what a later attempt reports for a row it did not take (``busy``, ``stale``) is free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from eoguard.envelope import new_message_id, now_ms
from eoguard.store.client import RedisClient
from eoguard.store.dedup import (
    BatchState,
    Claim,
    ClaimResult,
    DedupStore,
    DoneResult,
    ReleaseResult,
    RenewResult,
    position,
)
from eoguard.store.keys import DEFAULT_MAX_TTL_MS, KeySpace
from eoguard_spark.claims import ClaimInput, claim_partition
from eoguard_spark.decode import RowStatus
from eoguard_spark.dedup import batch_token
from eoguard_spark.worker import ClaimSettings

pytestmark = pytest.mark.integration

SCOPE, READER, GROUP, TOPIC = "app", "spark-0123456789ab", "a-group", "orders"
TOKEN = batch_token(READER, "5e2a9b7c-query", 3)
SHARDS = 4
OUTPUT = frozenset(RowStatus.to_output())  # statuses whose rows reach the sinks
S1_WAIT_MS = 50  # S1's busy wait: short, it gives the held row up
S2_WAIT_MS = 2_000  # S2 began later: its busy wait still runs when the consumer lets go
LAPSE_MS = 200  # the lease a crashed consumer's last renewal left (lease_lapsed)


class Task:
    """One Spark task's input: named ids at offsets 0, 1, ... of partition 0 of ``TOPIC``. The
    query and the consumer group read the same records: one position per reader."""

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        self.names = list(ids)
        self.expires_at_ms = now_ms() + 600_000

    def spark_at(self, name: str) -> str:
        return position(READER, TOPIC, 0, self.names.index(name))

    def consumer_at(self, name: str) -> str:
        return position(GROUP, TOPIC, 0, self.names.index(name))

    def rows(self) -> ClaimInput:
        ids = list(self.ids.values())
        return (pa.array(ids), pa.array([self.spark_at(name) for name in self.names]),
                pa.array([self.expires_at_ms] * len(ids), pa.int64()),
                pa.array([RowStatus.OK.value] * len(ids)),
                pa.array([KeySpace(shards=SHARDS).shard_of(i) for i in ids], pa.int64()))

    def consumer_claim(self, consumer: DedupStore, name: str) -> Claim:
        return consumer.new_claim(self.ids[name], self.consumer_at(name), self.expires_at_ms)


def settings(redis_url: str, key_prefix: str, **overrides: Any) -> ClaimSettings:
    values: dict[str, Any] = {"lease_ms": 60_000, "grace_ms": 60_000, "busy_wait_ms": S1_WAIT_MS,
                              "batch_size": 3, "key_shards": SHARDS, "token": TOKEN,
                              "max_ttl_ms": DEFAULT_MAX_TTL_MS}
    values.update(overrides)
    return ClaimSettings(redis_url=redis_url, key_prefix=key_prefix, scope=SCOPE,
                         ack_outbox=True, **values)


def consumer_store(redis_client: RedisClient, key_prefix: str) -> DedupStore:
    """The scope as a GuardedConsumer of group ``GROUP`` claims in it."""
    return DedupStore(redis_client, scope=SCOPE, keys=KeySpace(prefix=key_prefix, shards=SHARDS),
                      lease_ms=60_000, grace_ms=60_000)


def id_where(keys: KeySpace, fits: Callable[[int], bool]) -> str:
    """A fresh message id whose shard ``fits``."""
    return next(i for i in iter(new_message_id, "") if fits(keys.shard_of(i)))


def x_and_two_others(keys: KeySpace) -> tuple[str, str, str]:
    """X (a fresh id), an id off X's shard, and one off both their shards."""
    x = new_message_id()
    first = id_where(keys, lambda shard: shard != keys.shard_of(x))
    second = id_where(keys, lambda shard: shard not in (keys.shard_of(x), keys.shard_of(first)))
    return x, first, second


def attempt(conf: ClaimSettings, task: Task) -> dict[str, str]:
    """One attempt of the task: the real claim pass over its input; each row's status."""
    [statuses] = claim_partition(conf, iter([task.rows()]))
    return dict(zip(task.names, statuses.to_pylist(), strict=True))


def consumer_holds(consumer: DedupStore, task: Task, *names: str) -> tuple[str, list[Claim]]:
    """A consumer batch claims ``names`` at their consumer positions (NEW): its token, claims."""
    token = consumer.new_token()
    claims = [task.consumer_claim(consumer, name) for name in names]
    assert [o.result for o in consumer.claim(token, claims)] == [ClaimResult.NEW] * len(names)
    return token, claims


def driver_marks_done(conf: ClaimSettings) -> None:
    """Step 5 of the job as ``MicroBatchRunner._mark_done`` runs it: the scope's store on the
    driver's own client, one ``mark_done`` of the token over every shard."""
    client = conf.connect()
    try:
        conf.store(client).mark_done(conf.token)
    finally:
        client.close()


def records_of(conf: ClaimSettings) -> tuple[str, list[str]]:
    """The token's batch records, shown per shard, and those still open."""
    client = conf.connect()
    try:
        records = conf.store(client).batch_records(conf.token)
    finally:
        client.close()
    shown = ", ".join(f"{shard}:{'-' if r is None else r.state.name.lower()}"
                      for shard, r in enumerate(records))
    now = now_ms()
    still_open = [f"the token's record on shard {shard} is left open (lease left: "
                  f"{max(0, r.at_ms - now)} ms)" for shard, r in enumerate(records)
                  if r is not None and r.state is BatchState.OPEN]
    return shown, still_open


def consumer_pass(consumer: DedupStore, task: Task) -> dict[str, ClaimResult]:
    """A fresh consumer pass (the retry, or the group's re-read) over every record of the task,
    at the consumer's positions: what it gets per id."""
    claims = [task.consumer_claim(consumer, name) for name in task.names]
    outcomes = consumer.claim(consumer.new_token(), claims)
    return {name: o.result for name, o in zip(task.names, outcomes, strict=True)}


def broken_invariant(task: Task, committed: dict[str, str], consumer: dict[str, ClaimResult],
                     done_elsewhere: set[str]) -> list[str]:
    """Per id: exactly one of in the committed output / the consumer can handle it / done by
    the consumer elsewhere. Prints every id's case; returns those where it breaks."""
    broken: list[str] = []
    for name in task.names:
        in_output = committed[name] in OUTPUT
        handles = consumer[name].should_handle
        elsewhere = name in done_elsewhere
        line = (f"{name}: committed attempt {committed[name]!r}, fresh consumer claim "
                f"{consumer[name].name}{', done by the consumer' if elsewhere else ''}")
        holds = sum((in_output, handles, elsewhere))
        print(f"  {line}: {'ok' if holds == 1 else 'LOST' if holds == 0 else 'HANDLED TWICE'}")
        if holds != 1:
            broken.append(f"{line}: {'lost' if holds == 0 else 'handled twice'}")
    return broken


def let_go(consumer: DedupStore, token: str, held: Claim, how: str) -> None:
    """The consumer lets the claim ``held`` of its batch ``token`` go."""
    if how == "released":  # DedupStore.release: the pass goes on without it
        assert consumer.release(token, [held], strict=True) == [ReleaseResult.OK]
    elif how == "handler_failed":  # what a GuardedConsumer's done marks do with a failed one
        [settled] = consumer.done(token, [held], handled=[False])
        assert settled.result is DoneResult.RELEASED
    elif how == "given_back":  # a batch dropped whole (a revoke): its lease ends now
        assert consumer.give_back(consumer.records(token, [held])) == [RenewResult.RENEWED]
    else:  # lease_lapsed: it crashed; its lease runs out LAPSE_MS after its last renewal
        assert how == "lease_lapsed"
        assert consumer.renew(consumer.records(token, [held]), LAPSE_MS) == [RenewResult.RENEWED]


@pytest.mark.cluster
@pytest.mark.parametrize("how", ["released", "handler_failed", "given_back", "lease_lapsed"])
def test_a_row_the_committed_attempt_gave_up_stays_the_consumers_after_the_done_mark(
        how: str, redis_url: str, redis_client: RedisClient, key_prefix: str) -> None:
    """Step 1. The consumer did ``done_before`` already, and holds X (NEW), mid-handling.
    Step 2. S1 sees X BUSY until its wait ends: its row is ``busy``. S1's result is committed.
    Step 3. The consumer lets X go (``how``).
    Step 4. S2, a later attempt of the same task still in its busy wait, claims the same rows.
    Step 5. The driver marks the token done.
    Step 6. X must be in S1's output or still the consumer's to handle (not DUPLICATE)."""
    keys = KeySpace(prefix=key_prefix, shards=SHARDS)
    x, other_1, other_2 = x_and_two_others(keys)
    on_x = id_where(keys, lambda shard: shard == keys.shard_of(x))  # a record of X's shard
    off_x = id_where(keys, lambda shard: shard != keys.shard_of(x))
    task = Task({"other_1": other_1, "x": x, "beside_x": on_x, "other_2": other_2,
                 "done_before": off_x})
    consumer = consumer_store(redis_client, key_prefix)
    conf = settings(redis_url, key_prefix)

    before, [done_claim] = consumer_holds(consumer, task, "done_before")  # Step 1.
    assert [o.result for o in consumer.done(before, [done_claim])] == [DoneResult.OK]
    holder, [held] = consumer_holds(consumer, task, "x")
    s1 = attempt(conf, task)  # Step 2.
    assert s1["x"] == RowStatus.BUSY.value, f"the scenario needs X busy in S1: {s1}"
    let_go(consumer, holder, held, how)  # Step 3.
    s2 = attempt(replace(conf, busy_wait_ms=S2_WAIT_MS), task)  # Step 4.
    driver_marks_done(conf)  # Step 5.

    shown, still_open = records_of(conf)  # Step 6.
    claims = consumer_pass(consumer, task)
    print(f"[{how}] S1 (committed) {s1}\n  S2 (thrown away) {s2}\n  records of the token "
          f"after the done mark: {shown}")
    broken = broken_invariant(task, s1, claims, {"done_before"})
    problems = broken + still_open
    assert not problems, "\n".join(problems)


@pytest.mark.cluster
def test_an_attempt_after_the_done_mark_leaves_no_open_claim_where_the_token_took_nothing(
        redis_url: str, redis_client: RedisClient, key_prefix: str) -> None:
    """Step 1. The consumer holds X and Y, on a shard no other row of the task lies on.
    Step 2. S1 sees both BUSY and gives them up; it claims the other rows. It is committed.
    Step 3. The consumer's handler fails on X (let go) and succeeds on Y (done).
    Step 4. The driver marks the token done.
    Step 5. S2, an attempt launched before the done mark, claims the same rows: X is held by
            nobody now.
    Step 6. A consumer claiming X gets NEW, and no batch record of the token is open."""
    keys = KeySpace(prefix=key_prefix, shards=SHARDS)
    x, other_1, other_2 = x_and_two_others(keys)
    task = Task({
        "other_1": other_1, "x": x, "other_2": other_2,
        "y": id_where(keys, lambda shard: shard == keys.shard_of(x)),
    })
    consumer = consumer_store(redis_client, key_prefix)
    conf = settings(redis_url, key_prefix)

    holder, held = consumer_holds(consumer, task, "x", "y")  # Step 1.
    s1 = attempt(conf, task)  # Step 2.
    assert s1["x"] == s1["y"] == RowStatus.BUSY.value, f"the scenario needs X, Y busy: {s1}"
    settled = consumer.done(holder, held, handled=[False, True])  # Step 3.
    assert [o.result for o in settled] == [DoneResult.RELEASED, DoneResult.OK]
    driver_marks_done(conf)  # Step 4.
    done_shown, _ = records_of(conf)
    s2 = attempt(conf, task)  # Step 5.

    shown, still_open = records_of(conf)  # Step 6.
    claims = consumer_pass(consumer, task)
    print(f"S1 (committed) {s1}\n  records of the token at the done mark: {done_shown}\n"
          f"  S2 (after the done mark) {s2}\n  records of the token after S2: {shown}\n"
          f"  a consumer claiming X gets {claims['x'].name}")
    broken = broken_invariant(task, s1, claims, {"y"})
    if claims["x"] is not ClaimResult.NEW:
        broken.append(f"a consumer claiming X got {claims['x'].name}, not NEW")
    problems = broken + still_open
    assert not problems, "\n".join(problems)


@pytest.mark.cluster
def test_control_rows_whose_claim_outcome_every_attempt_shares(
        redis_url: str, redis_client: RedisClient, key_prefix: str) -> None:
    """Fine today. X is NEW in S1 and MINE in S2 (both outputs hold it); Z is held by the
    consumer throughout (busy in both); W is held by the consumer in S1 and done by it before
    S2. After the done mark X is DUPLICATE for the consumer, Z still the consumer's, W done."""
    task = Task({name: new_message_id() for name in ("x", "z", "o", "w")})
    consumer = consumer_store(redis_client, key_prefix)
    conf = settings(redis_url, key_prefix)

    consumer_holds(consumer, task, "z")
    holder, held = consumer_holds(consumer, task, "w")
    s1 = attempt(conf, task)
    consumer.done(holder, held)
    s2 = attempt(conf, task)
    driver_marks_done(conf)

    shown, still_open = records_of(conf)
    claims = consumer_pass(consumer, task)
    print(f"S1 (committed) {s1}\n  S2 (thrown away) {s2}\n  records of the token after the "
          f"done mark: {shown}\n  a consumer claiming X gets {claims['x'].name}")
    assert s1["x"] in OUTPUT
    assert s2["x"] in OUTPUT
    assert claims["x"] is ClaimResult.DUPLICATE
    broken = broken_invariant(task, s1, claims, {"w"})
    problems = broken + still_open
    assert not problems, "\n".join(problems)
