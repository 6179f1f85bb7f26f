"""A Spark standalone cluster from pip's pyspark whose workers are on different hosts.

``local-cluster[N,C,M]`` starts its workers inside the driver's JVM, all on the driver's host
name, so every executor reports the same host; and Spark never launches a speculative copy of
a task on a host where an attempt of it runs (``TaskSetManager.dequeueTaskFromList`` skips
``hasAttemptOnHost``). So on ``local-cluster`` a task can be marked speculatable but its copy
never starts. This cluster is ``local-cluster[2,1,1024]`` with that one difference: a master
on 127.0.0.1 and each worker (1 core, 1024 MB) on a loopback address of its own (127.0.0.2,
127.0.0.3; Linux routes all of 127/8 to ``lo``), so its executor reports a host of its own.

The daemons run through ``bin/spark-class`` of the pyspark package (``SPARK_HOME``), each in a
process group of its own; a worker starts its executors as child processes (its group), and
starts a new one when an executor dies.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pyspark

from tests.conftest import free_port
from tests.spark.driver import JIT_OPTIONS

SPARK_HOME = Path(pyspark.__file__).resolve().parent
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (from /proc), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm) state"


def command_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` and ``memory_mb`` each), each worker on its
    own loopback address; ``url`` is the master. Entered once the master is up (see
    :meth:`wait_for_workers`); stopped, with its executors, on exit."""

    def __init__(self, directory: Path, *, workers: int = 2, cores: int = 1,
                 memory_mb: int = 1024) -> None:
        self.directory = directory
        self.hosts = [f"127.0.0.{2 + i}" for i in range(workers)]
        self.cores, self.memory_mb = cores, memory_mb
        self.url = ""
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _daemon(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_DAEMON_MEMORY": "256m",
               # the master's and workers' JVMs, as the driver's and executors'
               "SPARK_DAEMON_JAVA_OPTS": JIT_OPTIONS,
               "SPARK_LOCAL_DIRS": str(self.directory / "local"),
               # no REST submission server (it listens on the fixed port 6066)
               "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        with (self.directory / f"{name}.log").open("wb") as log:
            return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout_s: float = 60) -> None:
        """Start the master and the workers at once (a worker retries until the master is
        up); return once the master is (the workers register meanwhile: a driver may start)."""
        (self.directory / "local").mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.master = self._daemon("master", "org.apache.spark.deploy.master.Master",
                                   "--host", "127.0.0.1", "--port", str(port),
                                   "--webui-port", "0")
        for i, host in enumerate(self.hosts):
            work = self.directory / f"work-{i}"
            work.mkdir(exist_ok=True)
            self.workers.append(self._daemon(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", host,
                "--port", "0", "--webui-port", "0", "--cores", str(self.cores),
                "--memory", f"{self.memory_mb}M", "--work-dir", str(work), self.url))
        self._wait_for("master", "New state: ALIVE", self.master, timeout_s)

    def wait_for_workers(self, timeout_s: float = 180) -> None:
        """Return once every worker registered with the master."""
        for i, worker in enumerate(self.workers):
            self._wait_for(f"worker-{i}", "Successfully registered with master", worker,
                           timeout_s)

    def _wait_for(self, name: str, line: str, proc: subprocess.Popen[bytes],
                  timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        log = self.directory / f"{name}.log"
        while line not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark {name} exited: {self.tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark {name} did not log {line!r} in {timeout_s:.0f} s: "
                                   f"{self.tail(name)}")
            time.sleep(0.2)

    def tail(self, name: str, chars: int = 3000) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")[-chars:]

    def executor_of(self, pid: int) -> int:
        """The executor JVM whose Python worker (or daemon) ``pid`` is: the first
        ``CoarseGrainedExecutorBackend`` up its parent chain, a child of one of this cluster's
        workers."""
        worker_pids = {w.pid for w in self.workers}
        current: int | None = pid
        while current is not None and current > 1:
            if EXECUTOR_CLASS in command_of(current):
                if parent_of(current) not in worker_pids:
                    raise AssertionError(f"executor {current} is not a child of this cluster's "
                                         f"workers {sorted(worker_pids)}")
                return current
            current = parent_of(current)
        raise AssertionError(f"no executor JVM up the parent chain of pid {pid}")

    def executor_arg(self, executor_pid: int, name: str) -> str:
        """An argument of an executor JVM's command line: ``--hostname`` (the host it reports
        to the driver), ``--executor-id``."""
        command = command_of(executor_pid)
        return command[command.index(name) + 1]

    def stop(self) -> None:
        """SIGTERM every daemon's process group (a worker stops its executors), SIGKILL what
        is left after 20 s."""
        procs = [p for p in [*self.workers, self.master] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for proc in procs:  # executors left in a worker's group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def master_log_lines(cluster: StandaloneCluster, pattern: str) -> list[str]:
    """Lines of the master's log matching ``pattern`` (e.g. executors it saw exit)."""
    return [line for line in cluster.tail("master", 1 << 20).splitlines()
            if re.search(pattern, line)]
