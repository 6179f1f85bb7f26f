"""Helpers of the consumer fault tests: worker processes and docs/design.md §10 checks."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import redis

from eoguard.envelope import Envelope
from eoguard.store.keys import KeySpace

WORKERS = Path(__file__).resolve().parent / "workers"


class Worker:
    """A worker script in a subprocess whose stdout lines arrive on a queue (``script``: a
    name in tests/fault/workers, or a path; ``env``: the process's whole environment)."""

    def __init__(self, script: str | Path, *args: str, log: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.log = log.open("a")
        self.proc = subprocess.Popen([sys.executable, str(WORKERS / script), *args],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout_s: float = 60.0, *,
                 missing_ok: bool = False) -> str | None:
        """The next line starting with ``prefix``; None if the process ended first (or, with
        ``missing_ok``, if none came within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    return None
                continue
            if line.startswith(prefix):
                return line
        if missing_ok:
            return None
        raise AssertionError(f"no {prefix!r} line within {timeout_s} s (see {self.log.name})")

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL
        self._reap(30)

    def stop(self) -> None:
        self.proc.terminate()
        self._reap(60)

    def wait(self, timeout_s: float = 60.0) -> int:
        """The exit code of a worker that ends by itself."""
        self._reap(timeout_s)
        return self.proc.returncode

    def _reap(self, timeout_s: float) -> None:
        self.proc.wait(timeout_s)
        self._pump_thread.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def effect_counts(client: redis.Redis, keys: KeySpace, scope: str) -> tuple[set[str], dict[str, int]]:
    """The ids in the scope's "seen" sets and every per-id counter's value (GETs pipelined,
    not one MGET: the counters of several shards span slots, which a Redis Cluster refuses)."""
    seen: set[str] = set()
    for key in client.scan_iter(match=keys.effect_pattern(scope, "seen"), count=1000):
        seen |= {m.decode() for m in client.smembers(key)}
    counter_keys = list(client.scan_iter(match=keys.effect_pattern(scope, "count:*"), count=5000))
    counts: dict[str, int] = {}
    for start in range(0, len(counter_keys), 1000):
        chunk = counter_keys[start:start + 1000]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.get(key)
        for key, value in zip(chunk, pipe.execute(), strict=True):
            counts[key.decode().rsplit("count:", 1)[1]] = int(value)
    return seen, counts


def check_dedup_ttls(client: redis.Redis, keys: KeySpace, scope: str, envs: list[Envelope],
                     grace_ms: int) -> None:
    """Invariant 5: every dedup key expires at expires_at + grace."""
    pipe = client.pipeline(transaction=False)
    for env in envs:
        pipe.pexpiretime(keys.dedup(scope, env.id))
    got = pipe.execute()
    want = [env.expires_at_ms + grace_ms for env in envs]
    assert got == want


def unique_group(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"
