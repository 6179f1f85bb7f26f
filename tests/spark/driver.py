"""A Spark job driver process for the fault tests: ``python tests/spark/driver.py OPTIONS_JSON``.

Environment:
  EOG_MASTER              Spark master (default ``local[2]``)
  EOG_CONF                JSON object of extra Spark settings
  EOG_PAUSE               ``hook:N:S`` sleeps S seconds in the foreach_batch hook of batch N
                          (Parquet committed; no ledger entry, no done mark, no Spark commit);
                          ``done:N:S`` sleeps after batch N's done marks (before Spark's commit).
                          Prints ``PAUSE <where> <N>`` first, so the test can SIGKILL it there.
  EOG_FAIL_TASKS          ``1``: a UDF before the claims fails the first attempt of every task
                          of partition 0 at its 30th row, once earlier rows are claimed.
Prints ``STATS <json>`` per batch, then ``EXECUTORS <n>`` (executor processes besides the
driver: 0 in local mode) and ``FINISHED`` when the query ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import redis
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812

from eoguard.codec import InputLimits
from eoguard.store.dedup import DedupStore
from eoguard_spark import (
    BatchStats,
    DedupMode,
    JobOptions,
    build_query,
    local_session,
    wait_for_acks,
)
from eoguard_spark.avro_schema import avro_session_conf

JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""For the driver's JVM and its executors' (local-cluster, standalone): each lives a minute or
two, and on a 2-core machine tiered compilation's C2 threads and G1's threads compete with the
job itself (a driver's start to its last batch: ~30-40 s instead of ~35-70 s here). C1 alone
and the serial collector run the same code, the same way; only how fast differs."""


def pause_at(where: str, batch_id: int) -> None:
    spec = os.environ.get("EOG_PAUSE", "")
    if not spec:
        return
    kind, batch, seconds = spec.split(":")
    if kind == where and int(batch) == batch_id:
        print(f"PAUSE {where} {batch_id}", flush=True)
        time.sleep(float(seconds))


def failing_transform(options: JobOptions) -> Callable[[DataFrame], DataFrame]:
    """Fails the first attempt of partition 0's task at its 30th row, once the scope's Redis
    holds a claim on one of the rows that task passed on before (so the retry re-owns it).

    The UDF returns a padding string so that, with a small ``spark.buffer.size``, its results
    stream to the claim stage batch by batch.
    """

    def transform(df: DataFrame) -> DataFrame:
        state: dict[str, Any] = {"rows": 0, "ids": []}

        def pad(message_id: str | None, status: str) -> str:
            ctx = TaskContext.get()
            state["rows"] += 1
            if status == "ok":
                state["ids"].append(message_id)
            if ctx is not None and ctx.attemptNumber() == 0 and ctx.partitionId() == 0 \
                    and state["rows"] == 30:
                client = redis.Redis.from_url(options.redis_url)
                store = DedupStore(client, scope=options.scope, keys=options.keyspace())
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not any(
                        store.check(i) for i in state["ids"]):
                    time.sleep(0.1)
                client.close()
                raise RuntimeError("injected failure of a first task attempt")
            return "x" * 100

        return (df.withColumn("_pad", F.udf(pad, "string")("id", "status"))
                .filter(F.length("_pad") > 0).drop("_pad"))

    return transform


def main() -> None:
    raw: dict[str, Any] = json.loads(sys.argv[1])
    raw["topics"] = tuple(raw["topics"])
    raw["dedup"] = DedupMode(raw.get("dedup", "redis"))
    raw["input_limits"] = InputLimits(**raw.get("input_limits", {}))
    options = JobOptions(**raw)
    # appended to the Avro reader's limits (avro_session_conf), which local_session would set
    jvm = {key: f"{value} {JIT_OPTIONS}" for key, value in avro_session_conf().items()}
    conf = {"spark.ui.showConsoleProgress": "false", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", **jvm,
            **json.loads(os.environ.get("EOG_CONF", "{}"))}
    spark = local_session(master=os.environ.get("EOG_MASTER", "local[2]"), shuffle_partitions=2,
                          conf=conf)
    spark.sparkContext.setLogLevel("WARN")

    def hook(_df: DataFrame, batch_id: int) -> None:
        pause_at("hook", batch_id)

    def report(stats: BatchStats) -> None:
        print("STATS " + json.dumps(asdict(stats)), flush=True)
        pause_at("done", stats.batch_id)

    transform = failing_transform(options) if os.environ.get("EOG_FAIL_TASKS") == "1" else None
    query = build_query(spark, options, foreach_batch=hook, transform=transform, on_batch=report)
    query.awaitTermination()
    wait_for_acks(query)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver's
    print(f"EXECUTORS {executors}", flush=True)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
