"""A service process the stack starts, finds again through its pid file, and stops."""

from __future__ import annotations

import abc
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from eoguard.errors import StackError


class ManagedProcess(abc.ABC):
    """Template for one local service: subclasses say how to prepare, run and probe it.

    State lives in ``workdir``: ``pid`` (the running process's pid and start time),
    ``service.log`` (its output).
    ``start`` is idempotent: a live, ready process from an earlier start is reused.
    """

    name: str = "service"

    def __init__(self, workdir: Path, *, ready_timeout_s: float = 60.0) -> None:
        self.workdir = workdir
        self.ready_timeout_s = ready_timeout_s
        self._child: subprocess.Popen[bytes] | None = None  # set when this object started it

    @property
    def log_path(self) -> Path:
        return self.workdir / "service.log"

    @property
    def _pid_path(self) -> Path:
        return self.workdir / "pid"

    @abc.abstractmethod
    def prepare(self) -> None:
        """Write config files and format data folders; called before every start."""

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The argv that runs the service in the foreground."""

    @abc.abstractmethod
    def is_ready(self) -> bool:
        """True once the service answers a real request."""

    @property
    def address(self) -> str:
        """Where clients reach the service, as they spell it."""
        raise NotImplementedError

    def pid(self) -> int | None:
        """The pid of the running service, or None when it is not running.

        The pid file holds the pid and the process's start time: a pid the kernel gave to
        another process since (a reused pid) starts at another time, so it is never taken for
        the service, nor signalled. A pid file of an older stack (the pid alone) names the
        service only if that process runs in the service's workdir, where it was started."""
        try:
            fields = self._pid_path.read_text().split()
            pid = int(fields[0])
            recorded = int(fields[1]) if len(fields) > 1 else None
        except (FileNotFoundError, ValueError, IndexError):
            return None
        stat = _stat(pid)
        if stat is None or stat.zombie:
            return None
        if recorded is None:
            return pid if _runs_in(pid, self.workdir) else None
        return pid if stat.start_ticks == recorded else None

    def start(self) -> bool:
        """Start the service and wait until it is ready; return False if it already ran."""
        if not self.launch():
            return False
        self.wait_ready()
        return True

    def launch(self) -> bool:
        """Start the process without waiting for it; False if it already answers.

        A member of a cluster is launched with its peers first and waited on after
        (:meth:`wait_ready`): a KRaft node is not ready before a quorum of voters runs.
        """
        if self.is_ready():
            # Ours from an earlier start, or another stack's on the same port: either way it
            # answers, and we did not start it now, so we will not stop it either.
            return False
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
            )
        self._child = proc
        stat = _stat(proc.pid)  # our unreaped child: its stat is there even if it exited
        self._pid_path.write_text(f"{proc.pid} {stat.start_ticks if stat else 0}")
        return True

    def wait_ready(self) -> None:
        """Wait until the launched process is ready; kill it and raise StackError if it never is."""
        proc = self._child
        assert proc is not None, "wait_ready() follows a launch() that started the process"
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._forget()
                raise StackError(
                    f"{self.name} exited with code {proc.returncode} while starting; "
                    f"its log is {self.log_path}"
                )
            if self.is_ready():
                return
            time.sleep(0.2)
        self.kill()
        raise StackError(
            f"{self.name} was not ready after {self.ready_timeout_s:.0f}s; its log is {self.log_path}"
        )

    def detach(self) -> None:
        """Leave the started process to run past this object (a test restarting a member of
        a stack it does not own): its pid file still names it, so the stack stops it; a
        daemon thread reaps it when it exits."""
        child, self._child = self._child, None
        if child is not None:
            threading.Thread(target=child.wait, name=f"reap-{self.name}", daemon=True).start()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default: a crash) and wait until the process is gone.

        A service that answers while its pid file names no process was started elsewhere
        (another checkout, by hand): it is never signalled, and a fault aimed at it raises
        StackError rather than pass as done."""
        pid = self.pid()
        if pid is None:
            self._forget()
            if self.is_ready():
                raise StackError(f"{self.name} at {self.address} answers, but this stack did "
                                 f"not start it (no live process in {self._pid_path}): it is "
                                 "not signalled; stop it where it was started, or give this "
                                 "stack other ports")
            return
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            self._forget()
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.pid() is not None:
            self._reap()
            time.sleep(0.05)
        self._forget()

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), escalating to SIGKILL after 20 s."""
        pid = self.pid()
        if pid is None:
            self._forget()
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            self._forget()
            return
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.pid() is not None:
            self._reap()
            time.sleep(0.1)
        self.kill()
        self._forget()

    def _reap(self) -> None:
        """Collect our own child's exit status so it does not linger as a zombie."""
        if self._child is not None and self._child.poll() is not None:
            self._child = None

    def _forget(self) -> None:
        """After the process is gone: reap it if it was our child, and drop its pid file."""
        if self._child is not None:
            self._child.wait(timeout=10)
            self._child = None
        self._pid_path.unlink(missing_ok=True)


@dataclass(frozen=True)
class _Stat:
    zombie: bool
    start_ticks: int  # when the process started, in clock ticks after boot


def _stat(pid: int) -> _Stat | None:
    """What /proc/<pid>/stat says of a process (fields 3 and 22), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and ")"
    return _Stat(zombie=fields[0] == "Z", start_ticks=int(fields[19]))


def _runs_in(pid: int, workdir: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")) == workdir.resolve()
    except OSError:
        return False
