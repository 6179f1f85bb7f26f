"""The Spark job against real Kafka, Redis and local Spark: duplicates, expiry, dead letters,
replayed micro-batches, the watermark mode and the foreach_batch hook."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from eoguard.envelope import now_ms
from eoguard.errors import ConfigError
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import Claim, DedupStore, IdState, parse_position, position
from eoguard.store.dedup_admin import scan_entries
from eoguard.store.keys import KeySpace
from eoguard_spark import DedupMode, JobOptions, build_query
from eoguard_spark.dedup import batch_token
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


def lose_batch(options: JobOptions, batch_id: int) -> None:
    """As if a crash lost batch ``batch_id``'s Spark commit, its ledger entry and its Parquet
    directory, after its done mark landed: the batch runs again from its claims."""
    assert options.output_path is not None
    forget(Path(options.checkpoint) / "commits", batch_id)
    forget(Path(options.checkpoint) / "eoguard" / "sunk", batch_id)
    shutil.rmtree(Path(options.output_path) / f"batch_id={batch_id}")


def shards_of(options: JobOptions, ids: Any) -> set[int]:
    return {options.keyspace().shard_of(i) for i in ids}


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
    assert all(b.records_done > 0 for b in stats if b.rows.get("new"))
    assert sum(b.records_already_done + b.records_lapsed for b in stats) == 0
    # Every claim the job made names one of its batches, is done, and lies at a position of
    # this query's reader on the topic.
    query_id = query_id_of(spark, options.checkpoint)
    reader = default_reader(query_id)
    tokens = {batch_token(reader, query_id, b.batch_id) for b in stats}
    entries = [e for page in scan_entries(redis_client, options.keyspace(), scope="app")
               for e in page]
    now = now_ms()
    print(f"claim keys={len(entries)} batch tokens={len(tokens)}")
    assert sorted(e.message_id for e in entries) == sorted(e.id for e in originals)
    assert all(e.token in tokens and e.id_state(now) is IdState.DONE for e in entries)
    assert {parse_position(e.position)[:2] for e in entries} == {(reader, topic)}
    # The default reader names the query by the id its checkpoint keeps, and is recorded there.
    assert reader.startswith("spark-")
    assert (Path(options.checkpoint) / "eoguard" / "reader").read_text() == reader


def test_claims_held_elsewhere_are_waited_on_then_taken_over_or_skipped(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client: redis.Redis) -> None:
    topic = new_topic(1)
    lapsing, held, free = (envelope(b"m%d" % i) for i in range(3))
    produce(kafka_bootstrap, topic, [lapsing, held, free])
    options = job_options([topic], busy_wait_s=4.0)
    keys = KeySpace(prefix=options.key_prefix)
    # e.g. a GuardedConsumer of the scope, mid-handling: its batches, its positions
    elsewhere = position("a-group", "other-topic", 0, 2)
    DedupStore(redis_client, scope="app", keys=keys, lease_ms=1_500).claim(
        "consumer-1", [Claim(lapsing.id, position("a-group", "other-topic", 0, 1),
                             lapsing.expires_at_ms)])
    DedupStore(redis_client, scope="app", keys=keys, lease_ms=600_000).claim(
        "consumer-2", [Claim(held.id, elsewhere, held.expires_at_ms)])

    stats = run_job(options)

    assert ids_of(spark, options.output_path) == Counter([lapsing.id, free.id])
    counted = totals(stats)
    assert (counted["new"], counted["busy"]) == (2, 1)  # `lapsing` taken over once it lapsed
    store = DedupStore(redis_client, scope="app", keys=keys)
    entry = store.check(held.id)
    assert entry is not None
    # still the other reader's, never marked done by the job
    assert (entry.token, entry.position) == ("consumer-2", elsewhere)
    assert entry.id_state(now_ms()) is IdState.IN_PROGRESS
    taken = store.check(lapsing.id)
    assert taken is not None
    assert taken.token != "consumer-1"
    assert taken.id_state(now_ms()) is IdState.DONE


def test_a_replay_re_owns_the_copy_its_earlier_attempt_claimed(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client: redis.Redis) -> None:
    """Two copies of one id in one partition; an earlier attempt (partitioned differently)
    claimed the later copy. The replay must output that copy, not wait on it and lose both."""
    topic = new_topic(1)
    message = envelope(b"twice")
    produce(kafka_bootstrap, topic, [message, message.with_attempt(2)])  # offsets 0 and 1
    options = job_options([topic], busy_wait_s=3.0, lease_s=600.0, reader="replayer")
    # The query id is the checkpoint's: given here, so the earlier attempt's token is known.
    query_id = str(uuid.uuid4())
    Path(options.checkpoint).mkdir(parents=True)
    (Path(options.checkpoint) / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    DedupStore(redis_client, scope="app", keys=KeySpace(prefix=options.key_prefix),
               lease_ms=600_000).claim(batch_token("replayer", query_id, 0), [
                   Claim(message.id, position("replayer", topic, 0, 1), message.expires_at_ms)])

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


@pytest.mark.parametrize("sink", ["parquet", "parquet-unbounded", "hook"])
def test_rows_expired_by_their_claim_are_dead_letters_with_a_reason(
        spark, new_topic, kafka_bootstrap, job_options, run_job, sink: str) -> None:
    """A row alive at the decode's clock may have expired by Redis's when it is claimed (a long
    batch, a short TTL). ``transform`` plays that: it hands expired rows on as ``ok``. The
    three variants take the three paths: one pass, and the cached path with and without a
    Parquet sink."""
    topic = new_topic(2)
    good = [envelope(b"g%d" % i) for i in range(10)]
    late = [envelope(b"x%d" % i, ttl_ms=-5_000) for i in range(4)]
    produce(kafka_bootstrap, topic, [*good, *late])
    options = job_options([topic])
    hooked: list[str] = []
    if sink == "hook":
        options = replace(options, output_path=None)
    elif sink == "parquet-unbounded":
        options = replace(options, max_offsets_per_trigger=None)

    def revive(rows: DataFrame) -> DataFrame:
        expired = F.col("status") == "expired"
        return (rows.withColumn("reason", F.when(~expired, F.col("reason")))
                .withColumn("status", F.when(expired, F.lit("ok")).otherwise(F.col("status"))))

    def hook(rows: DataFrame, _batch_id: int) -> None:
        hooked.extend(r["id"] for r in rows.select("id").collect())

    stats = run_job(options, transform=revive, foreach_batch=hook)

    print(f"statuses={dict(totals(stats))}")
    assert sorted(hooked) == sorted(e.id for e in good)
    if options.output_path:
        assert ids_of(spark, options.output_path) == Counter(e.id for e in good)
    assert (totals(stats)["new"], totals(stats)["expired"]) == (10, 4)
    dead = spark.read.parquet(options.dead_letter_path).collect()
    assert sorted(r["id"] for r in dead) == sorted(e.id for e in late)
    assert {r["status"] for r in dead} == {"expired"}
    assert all("found when claimed" in r["reason"] for r in dead), [r["reason"] for r in dead]


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
    # its records were done before the crash; nothing re-marked
    assert (again[0].records_done, again[0].records_already_done) == (
        0, first[-1].records_done)


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
    assert again[0].records_done == len(shards_of(options, (e.id for e in sent)))


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
    for batch in stats:  # one batch record per shard of the ids it handled, each marked done
        assert batch.records_done == len(shards_of(options, seen[batch.batch_id]))


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
    records = len(shards_of(options, (e.id for e in sent)))
    assert (first[0].records_done, first[0].records_already_done) == (records, 0)
    assert (again[0].records_done, again[0].records_already_done) == (0, records)


def test_a_replay_of_a_batch_whose_done_landed_writes_the_same_output(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client: redis.Redis) -> None:
    """The batch's Spark commit, ledger entry and Parquet directory are lost after its done
    mark: it claims again under its token, keeps its DONE_HERE rows and writes them again."""
    topic = new_topic(2)
    sent = [envelope(b"d%d" % i) for i in range(12)]
    produce(kafka_bootstrap, topic, [*sent, *sent[:4]])
    options = job_options([topic])
    first = run_job(options)
    assert [b.batch_id for b in first] == [0]
    before = spark.read.parquet(options.output_path).collect()
    lose_batch(options, 0)

    again = run_job(options)

    after = spark.read.parquet(options.output_path).collect()
    print(f"first run rows={dict(first[0].rows)} replay rows={dict(again[0].rows)}")
    assert first[0].rows == {"new": 12, "duplicate": 4}
    assert again[0].rows == {"done_here": 12, "duplicate": 4}
    assert not again[0].replayed  # claimed and written again, not read back
    assert sorted(map(tuple, after)) == sorted(map(tuple, before))
    assert (again[0].records_done, again[0].records_already_done) == (
        0, len(shards_of(options, (e.id for e in sent))))


def test_a_replay_of_a_done_batch_leaves_out_a_row_it_did_not_take(
        spark, new_topic, kafka_bootstrap, job_options, run_job, redis_client: redis.Redis) -> None:
    """The first run skipped a record another reader held (busy), giving it up under the batch's
    token; that reader let it go since. The replay of the done batch meets it free but given up
    (PASSED: busy again; nothing is taken under a done token), left out, so the output is the
    same (docs/design.md §7)."""
    topic = new_topic(1)
    held, *others = (envelope(b"t%d" % i) for i in range(5))
    produce(kafka_bootstrap, topic, [held, *others])
    options = job_options([topic], key_shards=1, busy_wait_s=1.0)  # one shard: one record
    store = DedupStore(redis_client, scope="app", keys=options.keyspace(), lease_ms=600_000)
    by_consumer = Claim(held.id, position("a-group", topic, 0, 0), held.expires_at_ms)
    store.claim("consumer-1", [by_consumer])
    first = run_job(options)
    before = spark.read.parquet(options.output_path).collect()
    store.release("consumer-1", [by_consumer], strict=True)  # e.g. its handler failed
    assert store.check(held.id) is None
    lose_batch(options, 0)

    again = run_job(options)

    after = spark.read.parquet(options.output_path).collect()
    print(f"first run rows={dict(first[0].rows)} replay rows={dict(again[0].rows)}")
    assert first[0].rows == {"new": 4, "busy": 1}
    assert again[0].rows == {"done_here": 4, "busy": 1}
    assert sorted(map(tuple, after)) == sorted(map(tuple, before))
    assert {r["id"] for r in after} == {e.id for e in others}
    assert store.check(held.id) is None  # nothing claimed under the done batch
    assert (again[0].records_done, again[0].records_already_done) == (0, 1)
