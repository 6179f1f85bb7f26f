"""The Spark scope through the fault window, speculating, an executor SIGKILLed mid-task.

When a full-mode seed draws ``spark-speculation`` (single-node topology), the Spark job is the
scope ``spark`` of the run: started before the window opens (its first micro-batch, the
injected records, warms its executors; minutes on two busy cores), it reads the topic with a
processing-time trigger (tests/fault/chaos/spark_driver.py) through every fault of the run. It
runs as tests/spark/test_speculation.py runs it, reusing its parts:

- on :class:`tests.spark.standalone.StandaloneCluster` (two 1-core executors, each worker on a
  loopback address of its own: on ``local-cluster`` both executors report the driver's host
  and Spark never starts a speculative copy there; see that module);
- with its ``SPECULATION`` settings (``quantile`` 0.5, ``multiplier`` 1.5, ``minTaskRuntime`` 3 s,
  ``task.duration.threshold`` 3 s so a stage's lone task is speculated too);
- with stragglers from ``tests/spark/straggler_site.py`` (a seeded half of the micro-batches
  have one partition's first attempt sleep ``STRAGGLE_S`` after its first claimed Arrow batch);
- its attempts counted from Spark's event logs (``task_attempts``), one per driver start.

The fault (:meth:`SpeculatingSpark.arm_executor_kill`, from test_seeded.py) waits in the
background for the next straggler to start sleeping and SIGKILLs the executor JVM running it:
the task is lost and runs again elsewhere (or its speculative copy wins). What the fault does
around it (a GuardedConsumer joining the scope, then paused) is test_seeded.py's. A supervisor
starts the driver again from its checkpoint whenever it fails (a Redis kill can fail a task
past ``spark.task.maxFailures``), as a deployment would. After the drain the job processes
what is left and stops. The scope's check (checker.spark): every guaranteed message unexpired
at the end is in the job's output or handled by the consumer, once across both.
"""

from __future__ import annotations

import json
import os
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

from eoguard.demo import observe
from eoguard.demo.plan import ORDER_SCHEMA
from eoguard.envelope import now_ms
from tests.fault.chaos.workload import GRACE_S, MAX_TTL_S, Run
from tests.spark import straggler_site
from tests.spark.standalone import StandaloneCluster
from tests.spark.test_speculation import SPECULATION, Attempt, task_attempts

ROOT = Path(__file__).resolve().parents[3]
SCOPE = "spark"
STRAGGLE_S = 10.0
MAX_STARTS = 12  # the supervisor gives up after this many starts of the driver


class SpeculatingSpark:
    """One chaos run's Spark job on a standalone cluster, speculation on."""

    def __init__(self, run: Run, rng: random.Random) -> None:
        self.run, self.folder = run, run.folder / "spark"
        self.log = run.folder / "spark.log"
        self.markers, self.site, self.events = (self.folder / n for n in ("markers", "site", "events"))
        self.stop_file = self.folder / "stop"
        # A seeded half of the micro-batches straggle (batch 0 starts the Python workers: no
        # yardstick for a straggler).
        self.plan = {batch: rng.randrange(4) for batch in range(1, 500) if rng.random() < 0.5}
        self.cluster: StandaloneCluster | None = None
        self.driver: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.failures: list[str] = []  # why the supervisor started the driver again
        self.ended_ms = 0
        self.killed: list[str] = []
        self.strikes: list[str] = []  # what each armed kill did, once it did
        self._ending = threading.Event()
        self._armed: list[threading.Thread] = []
        self.counts: dict[str, int] = {}
        self.violations: list[str] = []  # the job could not finish (restarts are no violation)
        self._supervisor: threading.Thread | None = None
        self._lock = threading.Lock()

    # Running ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the standalone cluster and the job (the workers register meanwhile)."""
        for directory in (self.markers, self.site, self.events):
            directory.mkdir(parents=True)
        shutil.copy(straggler_site.__file__, self.site / "sitecustomize.py")
        self.cluster = StandaloneCluster(self.folder / "cluster")
        self.cluster.__enter__()
        self._start_driver()
        self._supervisor = threading.Thread(target=self._supervise, name="spark-supervisor",
                                            daemon=True)
        self._supervisor.start()

    def wait_for_a_batch(self, timeout_s: float = 900.0) -> float:
        """Seconds until the job reported its first micro-batch (its executors and Python
        workers warm: on two busy cores that takes minutes, which the window should not)."""
        started = time.monotonic()
        while self._batches() == 0:
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"the Spark job ran no micro-batch in {timeout_s:.0f} s "
                                     f"({self.log})")
            time.sleep(1.0)
        return time.monotonic() - started

    def _conf(self) -> dict[str, str]:
        return {**SPECULATION, "spark.executor.cores": "1", "spark.executor.memory": "768m",
                "spark.locality.wait": "0",  # a copy starts on the other executor at once
                "spark.task.maxFailures": "8",  # through a Redis restart or pause
                "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(self.events),
                "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
                # the site first, then what the driver's own path adds (a source tree)
                "spark.executorEnv.PYTHONPATH": os.pathsep.join(
                    [str(self.site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
                f"spark.executorEnv.{straggler_site.ENV}":
                    straggler_site.plan_env(self.markers, self.plan, STRAGGLE_S),
                # the straggler holds the claims of its first Arrow batch while it sleeps
                "spark.sql.execution.arrow.maxRecordsPerBatch": "20"}

    def _start_driver(self) -> None:
        assert self.cluster is not None
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "EOG_MASTER": self.cluster.url,
               "EOG_CONF": json.dumps(self._conf()), "EOG_STOP": str(self.stop_file)}
        with self.log.open("ab") as log:
            self.driver = subprocess.Popen(
                [sys.executable, "-m", "tests.fault.chaos.spark_driver",
                 "--bootstrap", self.run.kafka, "--topic", self.run.topic, "--scope", SCOPE,
                 "--checkpoint", str(self.folder / "checkpoint"),
                 "--output", str(self.folder / "out"),
                 "--dead-letter", str(self.folder / "dead-letter"),
                 "--redis-url", self.run.redis_url, "--key-prefix", self.run.prefix,
                 "--max-ttl-s", f"{MAX_TTL_S:g}",
                 "--payload-schema", ORDER_SCHEMA, "--trigger", "3 seconds",
                 "--max-offsets-per-trigger", "2500", "--shuffle-partitions", "2",
                 "--lease-s", "60", "--busy-wait-s", "5", "--grace-s", str(GRACE_S)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env)
        self.starts += 1

    def _supervise(self) -> None:
        """Start the driver again whenever it exits before a clean end."""
        while True:
            with self._lock:
                driver = self.driver
            assert driver is not None
            code = driver.wait()
            if code == 0 and self.stop_file.exists():
                return
            with self._lock:
                self.failures.append(f"driver exited with {code} after {self._batches()} batches")
                if self.starts >= MAX_STARTS:
                    return
                time.sleep(2.0)
                self._start_driver()

    def _batches(self) -> int:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count('{"batch"')

    # The fault --------------------------------------------------------------------------------
    def arm_executor_kill(self, delay_s: float, *,
                          when_straggling: Callable[[], Callable[[], str]] | None = None) -> str:
        """From now on, in the background: SIGKILL the executor of the next straggler
        ``delay_s`` after it starts sleeping (:meth:`kill_executor`); the other faults of the
        run go on meanwhile. ``when_straggling`` is called as the straggler starts sleeping,
        and the function it returns once the executor is dead (its note is added)."""
        armed_at = time.time()

        def kill() -> None:
            after: list[Callable[[], str]] = []
            try:
                note = self.kill_executor(delay_s, since=armed_at, when_straggling=None
                                          if when_straggling is None
                                          else lambda: after.append(when_straggling()))
            except Exception as exc:  # noted: the run fails on it, not this thread alone
                note = f"the executor kill failed: {exc!r}"
                self.violations.append(f"spark: {note}")
            finally:
                notes = [then() for then in after]
            self.strikes.append("; ".join([note, *notes]))
            print(f"  spark-speculation: {self.strikes[-1]}", flush=True)

        thread = threading.Thread(target=kill, name="executor-kill", daemon=True)
        thread.start()
        self._armed.append(thread)
        return f"armed: the executor of the next straggler SIGKILLed {delay_s:.1f} s into it"

    def kill_executor(self, delay_s: float, *, timeout_s: float = 600.0,
                      since: float | None = None,
                      when_straggling: Callable[[], None] | None = None) -> str:
        """SIGKILL the executor JVM of the next straggler, ``delay_s`` after it starts sleeping
        (``when_straggling`` is called as it does, once)."""
        assert self.cluster is not None
        since = time.time() if since is None else since
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fresh = [m for m in straggler_site.read_markers(self.markers) if m["since"] >= since]
            for marker in fresh:
                if when_straggling is not None:
                    when_straggling()
                    when_straggling = None
                time.sleep(delay_s)
                try:
                    executor = self.cluster.executor_of(marker["pid"])
                except AssertionError:  # its attempt ended already (a copy won): the next one
                    since = marker["since"] + 1e-6
                    continue
                host = self.cluster.executor_arg(executor, "--hostname")
                os.kill(executor, signal.SIGKILL)
                note = (f"executor {executor} on {host} SIGKILLed {delay_s:.1f} s into the "
                        f"straggler of batch {marker['batch']} partition {marker['partition']}")
                self.killed.append(note)
                return note
            if self._ending.is_set() and (self.driver is None or self.driver.poll() is not None):
                break  # the job ended: no straggler is coming
            time.sleep(0.2)
        return f"no straggler started sleeping within {timeout_s:.0f} s: no executor killed"

    # The end ----------------------------------------------------------------------------------
    def finish(self, timeout_s: float = 900.0) -> str:
        """Ask the job to process what is left and stop; stop the cluster; what happened."""
        self._ending.set()
        self.stop_file.write_text("stop")
        assert self._supervisor is not None
        self._supervisor.join(timeout_s)
        for thread in self._armed:  # a kill armed late strikes a straggler of the last batches
            thread.join(60)
        with self._lock:
            driver = self.driver
        assert driver is not None
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(60)
            self.violations.append(f"spark: the job did not end within {timeout_s:.0f} s of "
                                   f"the stop ({self.log})")
        elif driver.returncode != 0:
            self.violations.append(f"spark: the job failed {self.starts} times, the last "
                                   f"with exit code {driver.returncode} ({self.log})")
        self.ended_ms = now_ms()
        if self.cluster is not None:
            self.cluster.__exit__(None, None, None)
        attempts = self.attempts()
        speculative = [a for a in attempts if a.speculative]
        lost = [a for a in attempts if a.end == "ExecutorLostFailure"]
        ends = Counter(a.end for a in speculative)
        self.counts = {"speculative": len(speculative),
                       "speculative_won": ends.get("Success", 0), "lost_tasks": len(lost),
                       "attempts": len(attempts), "driver_starts": self.starts,
                       "executors_killed": len(self.killed), "batches": self._batches()}
        return (f"{'; '.join(self.strikes)}\n    {self._batches()} batches over {self.starts} "
                f"driver start(s); speculative "
                f"attempts {len(speculative)} ({dict(ends)}); tasks lost to executor deaths "
                f"{len(lost)}; task attempts {len(attempts)}"
                + (f"; restarts: {'; '.join(self.failures)}" if self.failures else ""))

    def attempts(self) -> list[Attempt]:
        """Every task attempt of every application (each driver start) from the event logs
        (a killed driver's log ends ``.inprogress``: read up to its last complete line)."""
        return [attempt for path in sorted(self.events.iterdir()) if not path.name.startswith(".")
                for attempt in task_attempts(path)[0]]

    def output(self) -> Counter[str]:
        """Rows per message id across every ``batch_id=`` folder."""
        return observe.spark_output(self.folder / "out")

    def stop(self) -> None:
        """After a failed run: the driver and the cluster down, whatever state they are in."""
        self._ending.set()
        self.stop_file.parent.mkdir(parents=True, exist_ok=True)
        self.stop_file.write_text("stop")
        with self._lock:
            self.starts = MAX_STARTS  # the supervisor starts no other driver
            driver = self.driver
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(60)
        if self.cluster is not None:
            self.cluster.stop()
