"""The Spark job on more than one executor process writes what it writes in local mode.

``local-cluster[2,1,1024]`` runs a standalone master and two workers inside the driver's JVM;
each worker starts an executor JVM of its own (with its own Python workers) from pip's pyspark
(``SPARK_HOME`` is the package folder, which holds ``jars/`` and ``bin/``). The connector jars
reach the executors through ``spark.jars``, served by the driver. The same input goes through
the job on ``local[2]`` (the session fixture) and on the two executors, each run under its own
Redis prefix so neither finds the other's claims: the outputs hold the same messages, each
once, and the same dead letters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eoguard_spark import JobOptions
from tests.spark.test_faults import Driver, check_output, workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

LOCAL_CLUSTER = "local-cluster[2,1,1024]"
MESSAGE = ["id", "expires_at", "created_at", "producer", "payload_schema", "payload", "headers",
           "key", "topic"]
"""The output columns a message's copies share; which copy of an id a batch keeps (the
original or a resend, at another partition and offset) is whichever task claims it first."""


def rows(spark: SparkSession, path: str, columns: list[str] | None = None
         ) -> list[tuple[object, ...]]:
    """The rows of a Parquet output (``columns`` of them, or all), in a stable order."""
    frame = spark.read.parquet(path)
    return sorted((tuple(r) for r in frame.select(*(columns or frame.columns)).collect()), key=repr)


def test_two_executor_processes_write_what_local_mode_writes(
        spark, new_topic, kafka_bootstrap, job_options: Callable[..., JobOptions], run_job,
        key_prefix: str, tmp_path: Path) -> None:
    topic = new_topic(4)
    good, expired, malformed = workload(kafka_bootstrap, topic)
    same = {"max_offsets_per_trigger": 200, "busy_wait_s": 1.0}
    started = time.monotonic()
    local = job_options([topic], **same)
    run_job(local)
    local_s = time.monotonic() - started
    cluster = job_options([topic], **same, key_prefix=f"{key_prefix}c",
                          output_path=str(tmp_path / "out-cluster"),
                          dead_letter_path=str(tmp_path / "dead-cluster"))
    started = time.monotonic()
    run = Driver(cluster, tmp_path / "driver.log", EOG_MASTER=LOCAL_CLUSTER)
    executors = int(run.wait_for("EXECUTORS", timeout_s=600).split()[1])
    run.finish()
    cluster_s = time.monotonic() - started
    for options in (local, cluster):
        assert options.output_path is not None
        assert options.dead_letter_path is not None
    check_output(spark, local, good, expired, malformed, "local[2]")
    check_output(spark, cluster, good, expired, malformed, LOCAL_CLUSTER)
    out_local = rows(spark, local.output_path, MESSAGE)
    out_cluster = rows(spark, cluster.output_path, MESSAGE)
    dead_local = rows(spark, local.dead_letter_path)
    dead_cluster = rows(spark, cluster.dead_letter_path)
    print(f"{LOCAL_CLUSTER}: {executors} executor processes, {len(run.stats)} batches "
          f"({[round(b['duration_s'], 1) for b in run.stats]} s), {len(out_cluster)} output rows "
          f"and {len(dead_cluster)} dead letters in {cluster_s:.0f} s with the driver's start; "
          f"local[2]: {len(out_local)} and {len(dead_local)} in {local_s:.0f} s; "
          f"same messages: {out_cluster == out_local}, same dead letters: {dead_cluster == dead_local}")
    assert executors == 2
    assert out_cluster == out_local
    assert dead_cluster == dead_local
