"""The Spark job as a third consumer scope of a chaos run, its driver SIGKILLed mid-batch.

After the fault window the job reads the run's topic (``--available-now``, small
micro-batches), is SIGKILLed (its whole process group: driver, JVM, Python workers) once a
batch has been written and the next has begun, and runs again from its checkpoint to the
end. Its Parquet output must then hold each message once across all ``batch_id=`` folders.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from eoguard.demo import observe
from eoguard.demo.plan import ORDER_SCHEMA
from eoguard.envelope import now_ms
from tests.fault.chaos.workload import GRACE_S, MAX_TTL_S, Run

ROOT = Path(__file__).resolve().parents[3]
SCOPE = "spark"


class SparkScope:
    """One chaos run's Spark job: its folders, its runs, and its output."""

    def __init__(self, run: Run) -> None:
        self.run, self.folder = run, run.folder / "spark"
        self.log = run.folder / "spark.log"
        self.ended_ms = 0

    def _start(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "eoguard_spark", "--bootstrap", self.run.kafka,
                 "--topic", self.run.topic, "--scope", SCOPE,
                 "--checkpoint", str(self.folder / "checkpoint"),
                 "--output", str(self.folder / "out"),
                 "--dead-letter", str(self.folder / "dead-letter"),
                 "--redis-url", self.run.redis_url, "--key-prefix", self.run.prefix,
                 "--max-ttl-s", f"{MAX_TTL_S:g}",
                 "--payload-schema", ORDER_SCHEMA, "--available-now",
                 "--max-offsets-per-trigger", "2000", "--master", "local[2]",
                 "--lease-s", "60", "--busy-wait-s", "20", "--grace-s", str(GRACE_S)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def _batches(self) -> int:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count('{"batch"')

    def run_with_a_kill(self, rng: random.Random, timeout_s: float = 600.0) -> str:
        """Run the job, SIGKILL it mid-way, run it again from its checkpoint to the end."""
        job = self._start()
        deadline = time.monotonic() + timeout_s
        while self._batches() == 0 and job.poll() is None:
            assert time.monotonic() < deadline, f"no Spark batch within {timeout_s:.0f} s ({self.log})"
            time.sleep(0.5)
        killed = job.poll() is None
        if killed:
            time.sleep(rng.uniform(0.5, 4.0))  # inside the next micro-batch
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
        before = self._batches()
        again = self._start()
        code = again.wait(max(60.0, deadline - time.monotonic()))
        self.ended_ms = now_ms()
        assert code == 0, f"the restarted Spark job exited with {code} ({self.log})"
        return (f"driver SIGKILLed after {before} batches, restarted from its checkpoint"
                if killed else "the job ended before it could be killed")

    def output(self) -> Counter[str]:
        """Rows per message id across every ``batch_id=`` folder."""
        return observe.spark_output(self.folder / "out")
