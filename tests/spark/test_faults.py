"""Faults of the Spark job: the driver SIGKILLed mid-batch and restarted from its checkpoint,
task attempts failing and retried, speculation refused. Every run checks that the output holds
each unexpired message exactly once and no expired or malformed record (docs/design.md §10)."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from eoguard.envelope import Envelope
from eoguard.stack.feed import envelope, produce
from eoguard_spark import JobOptions

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.fault]

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "driver.py"


def driver_options(options: JobOptions) -> dict[str, Any]:
    """``options`` as the JSON the test driver (tests/spark/driver.py) takes."""
    raw = {name: getattr(options, name) for name in options.__dataclass_fields__}
    raw["dedup"] = options.dedup.value
    raw["input_limits"] = dataclasses.asdict(options.input_limits)
    return raw


class Driver:
    """A job driver in its own process group (driver Python, its JVM and Python workers)."""

    def __init__(self, options: JobOptions, log: Path, **env: str) -> None:
        raw = driver_options(options)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stats: list[dict[str, Any]] = []
        self._log = log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps(raw)], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=self._log, start_new_session=True,
            env={**os.environ, **env})
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("STATS "):
                self.stats.append(json.loads(line[6:]))
            self.lines.put(line.strip())
        self.lines.put("EOF")

    def wait_for(self, prefix: str, timeout_s: float = 240) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line.startswith(prefix):
                return line
            if line == "EOF" or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"driver ended or timed out before {prefix!r} "
                                     f"(see {self._log.name})")

    def kill(self) -> None:
        """SIGKILL the whole driver: Python, the JVM and the Python workers at once."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._close()

    def _close(self) -> None:
        self._pump_thread.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._log.close()

    def finish(self) -> None:
        self.wait_for("FINISHED")
        assert self.proc.wait(60) == 0
        self._close()


def workload(bootstrap: str, topic: str) -> tuple[list[Envelope], list[Envelope], list[bytes]]:
    """240 messages over 4 partitions, 40 resends elsewhere, 10 expired, 6 malformed."""
    good = [envelope(b"k%d" % i) for i in range(240)]
    expired = [envelope(b"e%d" % i, ttl_ms=-60_000) for i in range(10)]
    malformed = [b"junk-%d" % i for i in range(5)] + [b"\xc3\x01" + b"\x07" * 12]
    for p in range(4):
        produce(bootstrap, topic, good[p::4] + expired[p::4] + malformed[p::4], partition=p)
    produce(bootstrap, topic, [e.with_attempt(2) for e in good[:40]], partition=3)
    return good, expired, malformed


def check_output(spark: SparkSession, options: JobOptions, good: list[Envelope],
                 expired: list[Envelope], malformed: list[bytes], label: str) -> None:
    assert options.output_path is not None
    assert options.dead_letter_path is not None
    out = Counter(r["id"] for r in spark.read.parquet(options.output_path).select("id").collect())
    dead = spark.read.parquet(options.dead_letter_path).collect()
    positions = Counter((r["partition"], r["offset"]) for r in dead)
    print(f"{label}: output rows={sum(out.values())} distinct={len(out)} expected={len(good)} "
          f"dead letters={len(dead)} (expired={sum(r['status'] == 'expired' for r in dead)}, "
          f"malformed={sum(r['status'] == 'malformed' for r in dead)})")
    assert out == Counter(e.id for e in good), "every unexpired message exactly once"
    assert not {e.id for e in expired} & set(out)
    assert max(positions.values()) == 1, "a dead letter was written twice"
    assert Counter(r["status"] for r in dead) == {"expired": len(expired),
                                                  "malformed": len(malformed)}


def test_driver_killed_mid_batch_restarts_from_checkpoint_exactly_once(
        spark, new_topic, kafka_bootstrap, job_options: Callable[..., JobOptions],
        tmp_path: Path) -> None:
    topic = new_topic(4)
    good, expired, malformed = workload(kafka_bootstrap, topic)
    options = job_options([topic], max_offsets_per_trigger=50, busy_wait_s=1.0, lease_s=120.0)
    log = tmp_path / "driver.log"

    # Kill 1: in batch 1's hook - its Parquet committed; no ledger entry, done mark or commit.
    run = Driver(options, log, EOG_PAUSE="hook:1:120")
    run.wait_for("PAUSE hook 1")
    run.kill()
    # Kill 2: after batch 2's done marks, before Spark commits it.
    run = Driver(options, log, EOG_PAUSE="done:2:120")
    run.wait_for("PAUSE done 2")
    replayed = [s for s in run.stats if s["batch_id"] == 1]
    run.kill()
    assert replayed, "batch 1 ran again after the first kill"
    assert replayed[0]["replayed"], "batch 1 was taken from its committed Parquet"
    # Kill 3: at a random moment once the restarted driver is processing.
    seed = random.randrange(1 << 30)
    delay_s = random.Random(seed).uniform(0.0, 4.0)
    run = Driver(options, log)
    run.wait_for("STATS")
    time.sleep(delay_s)
    run.kill()
    print(f"random kill {delay_s:.2f} s after the first batch of run 3 (seed {seed})")
    # Last run: to the end.
    run = Driver(options, log, EOG_PAUSE="")
    run.finish()
    check_output(spark, options, good, expired, malformed, "after 3 SIGKILLs")


def test_replay_after_the_done_marks_rewrites_the_same_rows(
        spark, new_topic, kafka_bootstrap, job_options: Callable[..., JobOptions],
        tmp_path: Path) -> None:
    """Killed after batch 1's done marks, before Spark's commit; then the batch's ledger entry
    and Parquet commit are lost too (an object store's non-atomic rename, say), so the replay
    claims again: its rows are DONE_HERE and are written again, the same rows."""
    topic = new_topic(4)
    good, expired, malformed = workload(kafka_bootstrap, topic)
    options = job_options([topic], max_offsets_per_trigger=50, busy_wait_s=1.0, lease_s=120.0)
    assert options.output_path is not None
    log = tmp_path / "driver.log"
    run = Driver(options, log, EOG_PAUSE="done:1:120")
    run.wait_for("PAUSE done 1")
    run.kill()
    batch_dir = Path(options.output_path) / "batch_id=1"
    first = Counter(r["id"] for r in spark.read.parquet(str(batch_dir)).collect())
    assert first, "batch 1 wrote rows"
    shutil.rmtree(batch_dir)
    (Path(options.checkpoint) / "eoguard" / "sunk" / "1").unlink()

    run = Driver(options, log, EOG_PAUSE="")
    run.finish()
    [replay] = [s for s in run.stats if s["batch_id"] == 1]
    again = Counter(r["id"] for r in spark.read.parquet(str(batch_dir)).collect())
    print(f"replay of a done batch: first run wrote {sum(first.values())} rows, the replay "
          f"{sum(again.values())}; replay statuses {replay['rows']}")
    assert not replay["replayed"], "the replay claimed again (no ledger, no Parquet commit)"
    assert replay["rows"].get("done_here") == sum(first.values())
    assert again == first, "the replay wrote the same rows"
    check_output(spark, options, good, expired, malformed, "after a replay of a done batch")


def test_failed_task_attempts_are_retried_with_the_same_result(
        spark, new_topic, kafka_bootstrap, job_options: Callable[..., JobOptions],
        tmp_path: Path) -> None:
    topic = new_topic(4)
    good, expired, malformed = workload(kafka_bootstrap, topic)
    options = job_options([topic], max_offsets_per_trigger=200, busy_wait_s=1.0)
    conf = {"spark.sql.execution.arrow.maxRecordsPerBatch": "10",
            "spark.sql.execution.python.udf.maxRecordsPerBatch": "10",
            "spark.buffer.size": "256"}  # stream rows to the claims as they come
    run = Driver(options, tmp_path / "driver.log", EOG_MASTER="local[2,3]",
                 EOG_FAIL_TASKS="1", EOG_CONF=json.dumps(conf))
    run.finish()
    statuses: Counter[str] = Counter()
    for stats in run.stats:
        statuses.update(stats["rows"])
    print(f"task retries: statuses over {len(run.stats)} batches: {dict(statuses)}")
    assert "injected failure" in (tmp_path / "driver.log").read_text()
    assert statuses["mine"] > 0, "a retried task re-owned claims its failed attempt made"
    check_output(spark, options, good, expired, malformed, "after failed task attempts")


def test_speculation_runs_the_parquet_sink_and_refuses_a_hook_unless_idempotent(
        spark, new_topic, kafka_bootstrap, job_options: Callable[..., JobOptions],
        tmp_path: Path) -> None:
    """Speculative attempts claim under the batch's token at the same positions, and Spark
    commits one attempt's Parquet files: the job alone runs. A foreach_batch hook (the test
    driver always has one) is refused unless confirmed idempotent."""
    topic = new_topic(1)
    produce(kafka_bootstrap, topic, [envelope(b"s%d" % i) for i in range(3)])
    options = job_options([topic])
    assert options.output_path is not None
    args = [sys.executable, "-m", "eoguard_spark", "--bootstrap", kafka_bootstrap,
            "--topic", topic, "--scope", "app", "--checkpoint", options.checkpoint,
            "--output", options.output_path, "--redis-url", options.redis_url,
            "--key-prefix", options.key_prefix, "--available-now", "--master", "local[2]"]
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "--conf spark.speculation=true pyspark-shell"}
    allowed = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300, check=False)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    batches = [json.loads(line)["batch"] for line in allowed.stdout.splitlines()
               if line.startswith('{"batch"')]
    assert sum(b["rows"].get("new", 0) for b in batches) == 3
    assert spark.read.parquet(options.output_path).count() == 3

    hooked = job_options([topic], output_path=str(tmp_path / "out2"))
    raw = driver_options(hooked)
    speculation = {**os.environ, "EOG_CONF": json.dumps({"spark.speculation": "true"})}
    refused = subprocess.run([sys.executable, str(DRIVER), json.dumps(raw)], cwd=ROOT,
                             env=speculation, capture_output=True, text=True, timeout=300,
                             check=False)
    assert refused.returncode != 0
    assert "spark.speculation=true" in refused.stderr
    assert "idempotent_sink" in refused.stderr
