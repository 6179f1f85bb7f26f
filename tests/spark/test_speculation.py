"""Speculative task attempts and an executor SIGKILLed mid-task, on two executor processes,
with a GuardedConsumer of the same scope handling copies of half the messages meanwhile:
every message is handled exactly once across the job's Parquet output (Redis dedup mode) and
the consumer (docs/design.md §10: 1, 2, 3, and the dead letters once).

How the run is made to speculate, and why not on ``local-cluster``:

- **Two hosts.** Spark never starts a speculative copy of a task on a host where an attempt of
  it runs (``TaskSetManager.dequeueTaskFromList`` skips ``hasAttemptOnHost``).
  ``local-cluster[2,1,1024]`` gives both executors the driver's host name, so there a task is
  marked speculatable and its copy never starts (tried with a 15 s straggler among 4 tasks: no
  ``"Speculative": true`` task in the event log). The job runs on
  :class:`tests.spark.standalone.StandaloneCluster` instead: the same two 1-core, 1024 MB
  executor JVMs from pip's pyspark, each under a worker on a loopback address of its own.
- **Stragglers without touching the job.** ``tests/spark/straggler_site.py`` is copied as
  ``sitecustomize.py`` into a directory on the executors' ``PYTHONPATH``
  (``spark.executorEnv.PYTHONPATH``; pyspark's worker factory merges it into its Python
  workers' path). It wraps ``eoguard_spark.claims.claim_partition``: the first attempt of one
  partition (drawn from the seed) of micro-batches 1 and 2 (the ``streaming.sql.batchId``
  local property) claims its first Arrow batch, writes a marker with its pid and sleeps
  ``STRAGGLE_S``. Arrow batches hold 5 rows (``spark.sql.execution.arrow.maxRecordsPerBatch``),
  so the straggler holds some of its batch's claims while it sleeps. Batch 0 has none: its
  tasks start the executors' Python workers, so their median says nothing.
- **Which rule speculates.** A micro-batch's claim-and-write stage has a task per Kafka
  partition (4) and 2 slots: once half of them finished (``quantile`` 0.5), a task running
  longer than ``multiplier`` (1.5) x their median and than ``minTaskRuntime`` (3 s) is
  speculatable (checked every 200 ms), and its copy starts on the other executor once that
  one is free (no ``spark.locality.wait``: a Kafka task prefers one executor). The duration
  threshold (3 s) covers single-task stages only (Spark applies it to a stage with no more
  tasks than an executor has cores). ``efficiency.enabled`` is off: its progress-rate test
  reads task metrics that reach the driver only with executor heartbeats. Other slow tasks
  are copied too, and counted: a cold Python worker, or a task of the pass that settles the
  ``busy`` rows (it claims again, waiting up to ``busy_wait_s`` on the consumer's claims).
- **The executor kill.** Once the straggler of the last batch (2) sleeps, the test waits a
  seeded delay under 1.5 s and SIGKILLs its executor JVM: the ``CoarseGrainedExecutorBackend``
  up the marker pid's parent chain, a child of this test's worker. Its task is lost
  (``ExecutorLostFailure``) and runs again on the other executor, unless its copy there won
  already (a slow first Arrow batch on a busy machine); the worker starts a new executor.
  So batch 1 speculates on two warm executors, and batch 2 loses a task mid-claim.
- **Counting.** Spark's event log (``spark.eventLog.*``, plain JSON) says which attempts were
  speculative and how each ended; the test prints them and the tasks lost with the killed
  executor, and asserts that a speculative attempt ran and succeeded and that the driver lost
  the killed executor. Nothing is timed.

The GuardedConsumer reads copies of every other message (same ids, another topic, in the order
the job reads them) from the first straggler on, slowly (0.1 s a message, 10 per batch), and
its handler fails the first attempt of every third copy, which lets that claim go until its
retry 1 s later. The job waits on the consumer's claims (``busy``), and the consumer on the
job's, in both directions.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import Envelope
from eoguard.stack.feed import produce
from eoguard_spark import JobOptions
from tests.consumer_kit import ConsumerThread, committed_total, consumer_config
from tests.spark import straggler_site
from tests.spark.standalone import StandaloneCluster, master_log_lines
from tests.spark.test_faults import Driver, workload

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.fault]

BATCHES = 3  # workload(): 296 records over 4 partitions, 100 per micro-batch
STRAGGLE_S = 20.0
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "200ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "3s",
    "spark.speculation.task.duration.threshold": "3s",
    "spark.speculation.efficiency.enabled": "false",
}


@dataclass
class Attempt:
    """One task attempt as Spark's event log tells it."""

    stage: int
    partition: int
    attempt: int
    executor: str
    host: str
    speculative: bool
    batch: str | None = None
    end: str = "(no end event)"
    detail: str = ""

    def describe(self) -> str:
        return (f"batch {self.batch} stage {self.stage} partition {self.partition} attempt "
                f"{self.attempt}{' (speculative)' if self.speculative else ''} on "
                f"{self.host}/executor {self.executor}: {self.end}"
                f"{f' ({self.detail})' if self.detail else ''}")


def event_log(directory: Path, timeout_s: float = 60) -> Path:
    """The application's event log, once the driver's JVM closed it (else as it is)."""
    deadline = time.monotonic() + timeout_s
    while True:
        files = [p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")]
        done = [p for p in files if not p.name.endswith(".inprogress")]
        if done or (files and time.monotonic() > deadline):
            return (done or files)[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no event log in {directory}")
        time.sleep(0.2)


def task_attempts(log: Path) -> tuple[list[Attempt], dict[str, str]]:
    """Every task attempt of the application, with the micro-batch of its job; and the
    executors removed, with the reason."""
    attempts: dict[int, Attempt] = {}
    batch_of_stage: dict[int, str | None] = {}
    removed: dict[str, str] = {}
    with log.open() as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the last line of a log still being written
                break
            kind = event["Event"]
            if kind == "SparkListenerJobStart":
                batch = (event.get("Properties") or {}).get(straggler_site.BATCH_ID_PROPERTY)
                for stage in event["Stage IDs"]:
                    batch_of_stage[stage] = batch
            elif kind == "SparkListenerTaskStart":
                info = event["Task Info"]
                attempts[info["Task ID"]] = Attempt(
                    stage=event["Stage ID"], partition=info["Partition ID"],
                    attempt=info["Attempt"], executor=info["Executor ID"], host=info["Host"],
                    speculative=info["Speculative"], batch=batch_of_stage.get(event["Stage ID"]))
            elif kind == "SparkListenerTaskEnd":
                reason = event["Task End Reason"]
                attempt = attempts[event["Task Info"]["Task ID"]]
                attempt.end = reason["Reason"]
                attempt.detail = str(reason.get("Kill Reason") or reason.get("Loss Reason")
                                     or reason.get("Description") or "")
            elif kind == "SparkListenerExecutorRemoved":
                removed[event["Executor ID"]] = event["Removed Reason"]
    return list(attempts.values()), removed


def kill_straggler_executor(run: Driver, log: Path, cluster: StandaloneCluster,
                            markers: Path, batch: int, delay_s: float, first: threading.Event
                            ) -> dict[str, Any]:
    """Once the straggler of micro-batch ``batch`` sleeps, SIGKILL its executor JVM after
    ``delay_s``; sets ``first`` at the first straggler. Returns the straggler's marker with
    the executor's pid, id and host."""
    while True:
        slept = {marker["batch"]: marker for marker in straggler_site.read_markers(markers)}
        if slept:
            first.set()
        if batch in slept:
            break
        if run.proc.poll() is not None:
            raise AssertionError(f"the driver ended before the straggler of batch {batch} slept "
                                 f"(stragglers seen: {sorted(slept)}); its log ends:\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    time.sleep(delay_s)
    straggler = slept[batch]
    executor = cluster.executor_of(straggler["pid"])
    executor_id = cluster.executor_arg(executor, "--executor-id")
    host = cluster.executor_arg(executor, "--hostname")
    os.kill(executor, signal.SIGKILL)
    return {**straggler, "executor_pid": executor, "executor_id": executor_id, "host": host}


def check_exactly_once(spark: SparkSession, options: JobOptions, good: list[Envelope],
                       expired: list[Envelope], malformed: list[bytes],
                       handled: list[str]) -> Counter[str]:
    """§10 over the job's output and the consumer's handled ids together; the output's ids."""
    assert options.output_path is not None
    assert options.dead_letter_path is not None
    out = Counter(r["id"] for r in spark.read.parquet(options.output_path).select("id").collect())
    dead = spark.read.parquet(options.dead_letter_path).collect()
    total = out + Counter(handled)
    expected = Counter(e.id for e in good)
    lost = sorted(set(expected) - set(total))
    twice = sorted(i for i, n in total.items() if n > 1)
    print(f"invariants: output rows={sum(out.values())} consumer handled={len(handled)} "
          f"together distinct={len(total)} expected={len(expected)}; lost={len(lost)} "
          f"twice={len(twice)} (of them in the output twice: {sum(out[i] > 1 for i in twice)}, "
          f"by the consumer twice: {sum(handled.count(i) > 1 for i in twice)}); dead letters="
          f"{len(dead)} (expired={sum(r['status'] == 'expired' for r in dead)}, "
          f"malformed={sum(r['status'] == 'malformed' for r in dead)})")
    assert not lost, f"messages neither written nor handled: {lost[:5]}"
    assert not twice, f"messages handled more than once: {twice[:5]}"
    assert total == expected, "every unexpired message exactly once"
    assert not {e.id for e in expired} & set(total), "an expired message was handled"
    assert max(Counter((r["partition"], r["offset"]) for r in dead).values()) == 1, \
        "a dead letter was written twice"
    assert Counter(r["status"] for r in dead) == {"expired": len(expired),
                                                  "malformed": len(malformed)}
    return out


def test_speculative_attempts_and_an_executor_kill_handle_each_message_once(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix,
        job_options: Callable[..., JobOptions], tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # Not batch 0: its tasks start the executors' Python workers (tens of seconds on a busy
    # machine), so their median is no yardstick for a straggler.
    plan = {batch: rng.randrange(4) for batch in range(1, BATCHES)}
    # The last batch: the executor that replaces the killed one starts cold (its first tasks
    # take 10-20 s here), which would hold up the batches after it.
    kill_batch = BATCHES - 1
    kill_delay_s = rng.uniform(0.0, 1.5)
    print(f"seed {seed}: straggling partition per micro-batch {plan}; the executor of batch "
          f"{kill_batch}'s straggler SIGKILLed {kill_delay_s:.2f} s after it starts sleeping")

    topic = new_topic(4)
    good, expired, malformed = workload(kafka_bootstrap, topic)
    copies = good[::2]  # partitions 0 and 2, in the order the job reads them
    copy_topic = new_topic(1)
    produce(kafka_bootstrap, copy_topic, [e.with_attempt(2) for e in copies])
    fails_first = {e.id for e in copies[::3]}
    calls: Counter[str] = Counter()
    handled: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        calls[ctx.message_id] += 1
        time.sleep(0.1)
        if ctx.message_id in fails_first and calls[ctx.message_id] == 1:
            raise RuntimeError("the first attempt of this message fails")
        handled.append(ctx.message_id)

    config = consumer_config(kafka_bootstrap, redis_url, [copy_topic], prefix=key_prefix,
                             scope="app", dead_letter_topic=new_topic(1, prefix="dlq"),
                             batch_size=10, retry_backoff_s=1.0, retry_backoff_max_s=2.0,
                             busy_wait_s=30.0)

    options = job_options([topic], max_offsets_per_trigger=100, busy_wait_s=2.0,
                          idempotent_sink=True)  # driver.py's hook only pauses when told
    markers, site, events = tmp_path / "markers", tmp_path / "site", tmp_path / "events"
    for directory in (markers, site, events):
        directory.mkdir()
    shutil.copy(straggler_site.__file__, site / "sitecustomize.py")
    conf = {**SPECULATION, "spark.executor.cores": "1", "spark.executor.memory": "1024m",
            # Kafka tasks prefer an executor (its cached consumer): without a locality wait a
            # copy, or a task of the killed executor, starts on the other one at once
            "spark.locality.wait": "0",
            "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
            "spark.executorEnv.PYTHONPATH": str(site),
            f"spark.executorEnv.{straggler_site.ENV}":
                straggler_site.plan_env(markers, plan, STRAGGLE_S),
            "spark.sql.execution.arrow.maxRecordsPerBatch": "5"}

    started = time.monotonic()
    first_straggler = threading.Event()
    with StandaloneCluster(tmp_path / "cluster") as cluster:
        cluster_s = time.monotonic() - started
        consumer = ConsumerThread(config, handler, after=first_straggler)
        try:
            log = tmp_path / "driver.log"
            run = Driver(options, log, EOG_MASTER=cluster.url, EOG_CONF=json.dumps(conf))
            try:
                cluster.wait_for_workers()
                killed = kill_straggler_executor(run, log, cluster, markers, kill_batch,
                                                 kill_delay_s, first_straggler)
            except BaseException:
                run.kill()
                raise
            run.finish()
            job_s = time.monotonic() - started
            group = config.kafka["group.id"]
            deadline = time.monotonic() + 120
            while committed_total(kafka_bootstrap, group, copy_topic, 1)[0] < len(copies) \
                    and time.monotonic() < deadline and consumer.failure is None:
                time.sleep(0.5)
            time.sleep(1.0)  # a few more polls: nothing may be handled twice after that either
        finally:
            cstats = consumer.stop()
        launched = len(master_log_lines(cluster, "Launching executor"))

    attempts, removed = task_attempts(event_log(events))
    speculative = [a for a in attempts if a.speculative]
    lost = [a for a in attempts if a.end == "ExecutorLostFailure"]
    ends = Counter(a.end for a in speculative)
    slept = straggler_site.read_markers(markers)
    statuses: Counter[str] = Counter()
    for stats in run.stats:
        statuses.update(stats["rows"])
    print(f"master up in {cluster_s:.0f} s, job done {job_s:.0f} s after the start, "
          f"{len(run.stats)} batches, job statuses {dict(statuses)}")
    print(f"stragglers that slept (batch, partition): "
          f"{[(m['batch'], m['partition']) for m in slept]}; SIGKILLed executor pid "
          f"{killed['executor_pid']} (executor {killed['executor_id']} on {killed['host']}) "
          f"under the straggler of batch {killed['batch']} partition {killed['partition']}; "
          f"executors removed: {removed}; executors launched by the master: {launched}")
    print(f"speculative attempts: {len(speculative)} ran ({dict(ends)}); tasks lost to the "
          f"executor kill: {len(lost)}; task attempts in all: {len(attempts)}")
    stragglers = [a for a in attempts for m in slept
                  if (a.stage, a.partition, a.attempt) == (m["stage"], m["partition"], 0)]
    planned = {id(a) for a in stragglers}
    for attempt in sorted({id(a): a for a in speculative + lost + stragglers}.values(),
                          key=lambda a: (a.stage, a.partition, a.attempt)):
        print(f"  {attempt.describe()}{' <- planned straggler' if id(attempt) in planned else ''}")
    print(f"consumer: handled={cstats.handled} duplicates={cstats.duplicates} "
          f"retries={cstats.retries} busy_waits={cstats.busy_waits} "
          f"busy_skipped={cstats.busy_skipped} fenced={cstats.fenced} "
          f"first attempts failed={sum(1 for i in fails_first if calls[i])}")

    out = check_exactly_once(spark, options, good, expired, malformed, handled)
    print(f"of the consumer's {len(copies)} ids: {len(set(handled))} handled by the consumer, "
          f"{sum(1 for e in copies if out[e.id])} written by the job")
    assert speculative, "no speculative attempt ran (see the module docstring)"
    assert ends["Success"] >= 1, "no speculative attempt succeeded"
    assert killed["executor_id"] in removed, "the driver did not lose the SIGKILLed executor"
    # Not asserted: a task lost to the kill. The straggler's attempt runs when its marker is
    # written, but on a busy machine its copy can win (and Spark kill it) within the delay.
