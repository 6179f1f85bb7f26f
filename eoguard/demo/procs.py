"""The demo's subprocesses: started with their output in a log file, SIGKILLed like a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass
class Worker:
    """One subprocess of the demo and its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    killed: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no atexit, no flush, no goodbye - a crash."""
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def spawn(name: str, argv: list[str], *, log: Path, cwd: Path | None = None,
          env: Mapping[str, str] | None = None) -> Worker:
    """Run ``python ARGV`` (this interpreter) with stdout and stderr appended to ``log``;
    ``env`` adds to (or overrides) this process's environment."""
    out = log.open("ab")
    full = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    if cwd is not None:
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), full.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=full)
    return Worker(name, proc, out)
