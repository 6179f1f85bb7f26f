"""The Redis mode's outbox acknowledgement, which runs in the background after each batch's
done mark (eoguard_spark.acks), against real Kafka, Redis and local Spark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from eoguard.envelope import Envelope, now_ms
from eoguard.modes import KeepUntil
from eoguard.stack.feed import envelope, produce
from eoguard.store.outbox import Outbox, OutboxRecord
from eoguard_spark import BatchProcessor, JobOptions, build_query, wait_for_acks
from eoguard_spark import batch as batch_module
from eoguard_spark.sink import ParquetBatchSink
from eoguard_spark.worker import ClaimSettings, ack_files

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def in_outbox(client: redis.Redis, options: JobOptions, sent: list[Envelope]) -> Outbox:
    """The senders' outbox records of ``sent``, kept until consumed (what the job acks)."""
    outbox = Outbox(client, options.keyspace())
    stored = outbox.put([OutboxRecord(id=e.id, topic="t", key=None, value=b"v",
                                      created_at_ms=now_ms(), expires_at_ms=now_ms() + 600_000)
                         for e in sent], owner="p1", keep_until=KeepUntil.CONSUMED,
                        resend_after_ms=600_000)
    assert len(stored.stored) == len(sent)
    return outbox


def left(outbox: Outbox, sent: list[Envelope]) -> list[str]:
    return [e.id for e in sent if outbox.get(e.id) is not None]


def passes_on(where: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run the job's background passes on the driver (the output is on its filesystem, as in
    every test here) or, as with HDFS or S3, on the executors; returns a list that gets one
    entry per pass, naming where it ran."""
    ran: list[str] = []
    if where == "driver":
        real_files = batch_module.ack_files

        def on_driver(settings: Any, directory: str) -> int:
            assert Path(directory).is_dir(), directory  # the committed batch, on this machine
            ran.append("driver")
            return real_files(settings, directory)

        monkeypatch.setattr(batch_module, "ack_files", on_driver)
    else:
        real_ack = BatchProcessor._ack

        def on_executors(self: BatchProcessor, held: DataFrame) -> int:
            ran.append("executors")
            return real_ack(self, held)

        monkeypatch.setattr(ParquetBatchSink, "local_dir", lambda _self, _batch_id: None)
        monkeypatch.setattr(BatchProcessor, "_ack", on_executors)
    return ran


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_every_batchs_outbox_records_are_acknowledged_in_the_background(
        where: str, new_topic: Callable[..., str], kafka_bootstrap: str,
        job_options: Callable[..., JobOptions], run_job: Callable[..., list[Any]],
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = new_topic(2)
    sent = [envelope(b"m%d" % i) for i in range(25)]
    options = job_options([topic], max_offsets_per_trigger=10)
    outbox = in_outbox(redis_client, options, sent)
    produce(kafka_bootstrap, topic, sent)
    ran = passes_on(where, monkeypatch)

    stats = run_job(options)  # waits for the last batch's pass

    remaining = left(outbox, sent)
    print(f"batches={len(stats)} deferred={[s.ack_deferred for s in stats]} passes={ran} "
          f"outbox records left={len(remaining)} of {len(sent)}")
    assert len(stats) == 3
    assert all(s.ack_deferred for s in stats)
    assert ran == [where] * 3
    assert remaining == []


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_start_acknowledges_the_batch_before_it_once_more(
        where: str, new_topic: Callable[..., str], kafka_bootstrap: str,
        job_options: Callable[..., JobOptions], run_job: Callable[..., list[Any]],
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash can cut a batch's background pass short after Spark committed the batch (no
    replay then). A run without acknowledgements plays that; the next start, on the same
    checkpoint, acknowledges that batch before its own."""
    topic = new_topic(1)
    first = [envelope(b"a%d" % i) for i in range(6)]
    options = job_options([topic])
    outbox = in_outbox(redis_client, options, first)
    produce(kafka_bootstrap, topic, first)
    run_job(replace(options, ack_outbox=False))
    assert len(left(outbox, first)) == len(first)  # the pass that was cut short

    second = [envelope(b"b%d" % i) for i in range(4)]
    in_outbox(redis_client, options, second)
    produce(kafka_bootstrap, topic, second)
    ran = passes_on(where, monkeypatch)
    stats = run_job(options)

    print(f"second start: batches={[s.batch_id for s in stats]} outbox records left: "
          f"{len(left(outbox, first))} of batch 0, {len(left(outbox, second))} of batch 1")
    assert [s.batch_id for s in stats] == [1]
    assert ran == [where] * 2  # batch 0's pass once more, then batch 1's
    assert left(outbox, first) == []
    assert left(outbox, second) == []


def test_the_drivers_pass_reads_only_the_batchs_data_files(
        tmp_path: Path, job_options: Callable[..., JobOptions], redis_client: redis.Redis) -> None:
    """``ack_files`` acknowledges the ids of a batch directory's Parquet part files, and none of
    what Spark and the sink put beside them (markers, checksums, temporary directories), all
    named ``_*`` or ``.*``; an empty batch acknowledges nothing."""
    options = job_options(["t"])
    sent = [envelope(b"d%d" % i) for i in range(30)]
    decoys = [envelope(b"x%d" % i) for i in range(3)]
    outbox = in_outbox(redis_client, options, sent + decoys)
    batch = tmp_path / "batch_id=0"
    (batch / "_temporary" / "0").mkdir(parents=True)
    pq.write_table(pa.table({"id": [e.id for e in sent[:20]]}), batch / "part-00000.parquet")
    pq.write_table(pa.table({"id": [e.id for e in sent[20:]]}), batch / "part-00001.parquet")
    for at, decoy in zip(["_temporary/0/part-00000.parquet", ".part-00002.parquet",
                          "_part-00003.parquet"], decoys, strict=True):
        pq.write_table(pa.table({"id": [decoy.id]}), batch / at)
    (batch / "_SUCCESS").write_text("")
    (batch / "_EOGUARD_COMMITTED").write_text("q")
    (batch / ".part-00000.parquet.crc").write_bytes(b"crc")
    (tmp_path / "batch_id=1").mkdir()
    settings = ClaimSettings.of(options)

    acked = ack_files(settings, str(batch))
    empty = ack_files(settings, str(tmp_path / "batch_id=1"))

    print(f"acknowledged {acked} of {len(sent)}; decoys left {len(left(outbox, decoys))}; "
          f"empty batch {empty}")
    assert acked == len(sent)
    assert left(outbox, sent) == []
    assert left(outbox, decoys) == [e.id for e in decoys]
    assert empty == 0


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_failed_pass_fails_the_next_batch(
        where: str, spark: SparkSession, new_topic: Callable[..., str], kafka_bootstrap: str,
        job_options: Callable[..., JobOptions], monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass runs after its batch's commit: its error fails the batch after it, as an inline
    pass would have failed its own (so Spark never commits a batch past a failed pass)."""
    topic = new_topic(1)
    produce(kafka_bootstrap, topic, [envelope(b"f%d" % i) for i in range(8)])
    options = job_options([topic], max_offsets_per_trigger=5)

    def broken(*_args: Any) -> int:
        raise RuntimeError("injected acknowledgement failure")

    if where == "driver":
        monkeypatch.setattr(batch_module, "ack_files", broken)
    else:
        monkeypatch.setattr(ParquetBatchSink, "local_dir", lambda _self, _batch_id: None)
        monkeypatch.setattr(BatchProcessor, "_ack", broken)
    stats: list[Any] = []
    query = build_query(spark, options, on_batch=stats.append)
    try:
        with pytest.raises(StreamingQueryException, match="injected acknowledgement failure"):
            query.awaitTermination(300)
    finally:
        query.stop()
    print(f"batches reported={[s.batch_id for s in stats]}")
    assert [s.batch_id for s in stats] == [0]  # batch 1 failed at its pass's submit
    assert wait_for_acks(query) is None  # the error was raised once, by batch 1
