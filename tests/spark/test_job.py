"""The Spark job against real Kafka, Redis and local Spark: duplicates, expiry, dead letters,
replayed micro-batches, the watermark mode and the foreach_batch hook."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame, SparkSession

from eoguard.errors import ConfigError
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import Claim, DedupState, DedupStore, owner_token
from eoguard.store.keys import KeySpace
from eoguard_spark import DedupMode, build_query
from eoguard_spark.sink import default_reader, query_id_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def ids_of(spark: SparkSession, path: str) -> Counter[str]:
    return Counter(r["id"] for r in spark.read.parquet(path).select("id").collect())


def forget(directory: Path, batch_id: int) -> None:
    """Remove a checkpoint log entry and its Hadoop checksum file."""
    os.remove(directory / str(batch_id))
    crc = directory / f".{batch_id}.crc"
    if crc.exists():
        os.remove(crc)


def totals(stats: list[Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    for batch in stats:
        out.update(batch.rows)
    return out


def test_duplicates_in_the_topic_come_out_once(spark, new_topic, kafka_bootstrap, job_options,
                                               run_job, redis_client: redis.Redis) -> None:
    topic = new_topic(4)
    originals = [envelope(b"m%d" % i) for i in range(60)]
    for p in range(4):
        produce(kafka_bootstrap, topic, originals[p::4], partition=p)
    # Resends (attempt 2) at other offsets, some in another partition, some in the same one.
    produce(kafka_bootstrap, topic, [e.with_attempt(2) for e in originals[:20]], partition=1)
    produce(kafka_bootstrap, topic, originals[:8], partition=0)  # the very same bytes again
    options = job_options([topic], max_offsets_per_trigger=25)

    stats = run_job(options)

    out = ids_of(spark, options.output_path)
    print(f"output rows={sum(out.values())} distinct={len(out)} batches={len(stats)} "
          f"statuses={dict(totals(stats))}")
    assert out == Counter(e.id for e in originals)  # every message, each exactly once
    counted = totals(stats)
    assert counted["new"] == 60
    assert counted["duplicate"] == 28  # copies in the same batch too: no wait, no "busy"
    assert sum(b.done for b in stats) == 60
    store = DedupStore(redis_client, scope="app", keys=KeySpace(prefix=options.key_prefix))
    entry = store.check(originals[0].id)
    assert entry is not None
    assert entry.state is DedupState.DONE
    # The default reader names the query by the id its checkpoint keeps, and is recorded there.
    reader = default_reader(query_id_of(spark, options.checkpoint))
    assert reader.startswith("spark-")
    assert entry.owner.startswith(f"app|{reader}|{topic}|")
    assert (Path(options.checkpoint) / "eoguard" / "reader").read_text() == reader


def test_claims_held_elsewhere_are_waited_on_then_taken_over_or_skipped(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client: redis.Redis) -> None:
    topic = new_topic(1)
    lapsing, held, free = (envelope(b"m%d" % i) for i in range(3))
    produce(kafka_bootstrap, topic, [lapsing, held, free])
    options = job_options([topic], busy_wait_s=4.0)
    keys = KeySpace(prefix=options.key_prefix)
    elsewhere = "app|a-group|other-topic|0|"  # e.g. a GuardedConsumer of the scope, mid-handling
    DedupStore(redis_client, scope="app", keys=keys, lease_ms=1_500).claim(
        [Claim(lapsing.id, elsewhere + "1", lapsing.expires_at_ms)])
    DedupStore(redis_client, scope="app", keys=keys, lease_ms=600_000).claim(
        [Claim(held.id, elsewhere + "2", held.expires_at_ms)])

    stats = run_job(options)

    assert ids_of(spark, options.output_path) == Counter([lapsing.id, free.id])
    counted = totals(stats)
    assert (counted["new"], counted["taken_over"], counted["busy"]) == (1, 1, 1)
    entry = DedupStore(redis_client, scope="app", keys=keys).check(held.id)
    assert entry is not None
    assert entry.owner == elsewhere + "2"  # still the other owner's, never marked done by us


def test_a_replay_re_owns_the_copy_its_earlier_attempt_claimed(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client: redis.Redis) -> None:
    """Two copies of one id in one partition; an earlier attempt (partitioned differently)
    claimed the later copy. The replay must output that copy, not wait on it and lose both."""
    topic = new_topic(1)
    message = envelope(b"twice")
    produce(kafka_bootstrap, topic, [message, message.with_attempt(2)])  # offsets 0 and 1
    options = job_options([topic], busy_wait_s=3.0, lease_s=600.0, reader="replayer")
    DedupStore(redis_client, scope="app", keys=KeySpace(prefix=options.key_prefix),
               lease_ms=600_000).claim([Claim(message.id, owner_token("app", "replayer", topic, 0, 1),
                                              message.expires_at_ms)])

    stats = run_job(options)

    out = spark.read.parquet(options.output_path).collect()
    assert [(r["id"], r["offset"]) for r in out] == [(message.id, 1)]
    assert (totals(stats)["mine"], totals(stats)["duplicate"]) == (1, 1)


def test_expired_and_malformed_never_reach_the_output(spark, new_topic, kafka_bootstrap,
                                                      job_options, run_job) -> None:
    topic = new_topic(2)
    good = [envelope(b"g%d" % i) for i in range(10)]
    expired = [envelope(b"x%d" % i, ttl_ms=-5_000) for i in range(4)]
    malformed = [b"not an envelope", b"\xc3\x01" + b"\x00" * 8 + b"body?", b""]
    produce(kafka_bootstrap, topic, [*good, *expired, *malformed])
    options = job_options([topic])

    stats = run_job(options)

    assert ids_of(spark, options.output_path) == Counter(e.id for e in good)
    counted = totals(stats)
    assert (counted["new"], counted["expired"], counted["malformed"]) == (10, 4, 3)
    dead = spark.read.parquet(options.dead_letter_path).collect()
    assert Counter(r["status"] for r in dead) == {"expired": 4, "malformed": 3}
    assert {r["id"] for r in dead if r["status"] == "expired"} == {e.id for e in expired}
    assert all(r["reason"] for r in dead)
    assert {bytes(r["value"]) for r in dead if r["status"] == "malformed"} == set(malformed)


@pytest.mark.parametrize("lose_ledger", [False, True], ids=["after-ledger", "before-ledger"])
def test_a_replayed_batch_replaces_its_output(spark, new_topic, kafka_bootstrap, job_options,
                                              run_job, lose_ledger: bool) -> None:
    """A crash after the sinks committed but before Spark's commit log: the batch runs again."""
    topic = new_topic(2)
    sent = [envelope(b"r%d" % i) for i in range(30)]
    produce(kafka_bootstrap, topic, [*sent, *sent[:5]])
    options = job_options([topic], max_offsets_per_trigger=20)
    first = run_job(options)
    last = first[-1].batch_id
    # Forget Spark's commit of the last batch (and our ledger entry), as a crash would.
    forget(Path(options.checkpoint) / "commits", last)
    if lose_ledger:
        forget(Path(options.checkpoint) / "eoguard" / "sunk", last)

    again = run_job(options)

    assert [b.batch_id for b in again] == [last]
    assert again[0].replayed
    assert ids_of(spark, options.output_path) == Counter(e.id for e in sent)
    assert again[0].done == 0  # its claims were done before the crash; nothing re-marked


def test_a_batch_whose_sink_never_committed_is_written_again(spark, new_topic, kafka_bootstrap,
                                                             job_options, run_job) -> None:
    """Claims re-owned: a rerun of the same offsets writes the same rows (MINE, not duplicate)."""
    topic = new_topic(2)
    sent = [envelope(b"s%d" % i) for i in range(12)]
    produce(kafka_bootstrap, topic, sent)
    # First run: a hook that fails the batch after the claims and the Parquet write, so no
    # done mark, no ledger entry and no Spark commit are made.
    options = job_options([topic])

    def fail(_df: DataFrame, _batch_id: int) -> None:
        raise RuntimeError("boom")

    with pytest.raises(Exception, match="boom"):
        run_job(options, foreach_batch=fail)
    shutil.rmtree(Path(options.output_path))  # as if the crash hit before the rename

    again = run_job(options)

    assert ids_of(spark, options.output_path) == Counter(e.id for e in sent)
    assert totals(again)["mine"] == 12
    assert again[0].done == 12


def test_a_checkpoint_keeps_its_reader(spark, new_topic, kafka_bootstrap, job_options,
                                       run_job) -> None:
    """Restarting a checkpoint under another reader would orphan its claims: refused."""
    topic = new_topic(1)
    produce(kafka_bootstrap, topic, [envelope(b"k%d" % i) for i in range(3)])
    options = job_options([topic], reader="billing-job")
    assert totals(run_job(options))["new"] == 3

    with pytest.raises(ConfigError, match="billing-job"):
        build_query(spark, replace(options, reader="renamed-job"))
    produce(kafka_bootstrap, topic, [envelope(b"late")])
    assert totals(run_job(replace(options, reader=None)))["new"] == 1  # unset: the recorded one


def test_watermark_mode_drops_duplicates_within_the_query(spark, new_topic, kafka_bootstrap,
                                                          job_options, run_job,
                                                          redis_client: redis.Redis) -> None:
    topic = new_topic(2)
    sent = [envelope(b"w%d" % i) for i in range(20)]
    produce(kafka_bootstrap, topic, [*sent, *sent[:7], b"junk"])
    options = job_options([topic], dedup=DedupMode.WATERMARK, watermark_delay="1 hour",
                          max_offsets_per_trigger=12)

    stats = run_job(options)

    assert ids_of(spark, options.output_path) == Counter(e.id for e in sent)
    assert totals(stats)["malformed"] == 1
    assert not list(redis_client.scan_iter(match=f"{options.key_prefix}:*", count=1000))


def test_foreach_batch_hook_gets_each_batch_once_with_its_id(spark, new_topic, kafka_bootstrap,
                                                             job_options, run_job) -> None:
    topic = new_topic(1)
    sent = [envelope(b"h%d" % i) for i in range(9)]
    produce(kafka_bootstrap, topic, [*sent, *sent[:3]])
    options = job_options([topic], output_path=None, max_offsets_per_trigger=4)
    seen: dict[int, list[str]] = {}

    def hook(df: DataFrame, batch_id: int) -> None:
        seen[batch_id] = [r["id"] for r in df.select("id").collect()]

    stats = run_job(options, foreach_batch=hook)

    assert sorted(seen) == [b.batch_id for b in stats] == [0, 1, 2]
    assert Counter(i for ids in seen.values() for i in ids) == Counter(e.id for e in sent)
    assert sum(b.done for b in stats) == 9


def test_a_replayed_batch_does_not_call_the_hook_again_once_recorded(
        spark, new_topic, kafka_bootstrap, job_options, run_job) -> None:
    topic = new_topic(1)
    sent = [envelope(b"l%d" % i) for i in range(6)]
    produce(kafka_bootstrap, topic, sent)
    options = job_options([topic], output_path=None)
    calls: list[int] = []

    def hook(df: DataFrame, batch_id: int) -> None:
        calls.append(batch_id)

    first = run_job(options, foreach_batch=hook)
    forget(Path(options.checkpoint) / "commits", first[-1].batch_id)  # crash before the commit

    again = run_job(options, foreach_batch=hook)

    assert calls == [0]  # the ledger says the sink had it: not called twice
    assert again[0].replayed
    assert (again[0].done, again[0].already_done) == (0, 6)
