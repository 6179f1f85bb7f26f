"""The machine's busy CPU time, every process on every core (``/proc/stat``).

On a machine whose cores the client, the broker and Redis share, the machine's CPU per message
sets a ceiling once the cores are busy: a variant that costs twice its baseline's cannot pass
half its rate then. Below that (a single Python thread, or waits, bound the rate) the ratio is
the cost, not a bound. Every process counts: the figures mean something only with nothing
else running. Beside it, the one reading of the Redis server's own CPU (:func:`redis_cpu_s`).
"""

from __future__ import annotations

import os

import redis

__all__ = ["MachineCpu", "busy_cpu_s", "redis_cpu_s", "tree_cpu_s"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _read() -> tuple[int, int]:
    """(busy, total) jiffies so far, summed over the cores."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


class MachineCpu:
    """Busy CPU since construction: as a share of every core's time, or per message."""

    def __init__(self) -> None:
        self._busy, self._total = _read()

    def share(self) -> float:
        """Busy time over all time, every core (1.0: every core busy throughout)."""
        busy, total = _read()
        return (busy - self._busy) / max(1, total - self._total)

    def per_message_us(self, n: int) -> float:
        """Busy CPU microseconds per message, every process (broker and Redis included)."""
        return (_read()[0] - self._busy) * _TICK_S / n * 1e6


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis server used so far (INFO cpu, user + system, main thread)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _stat(pid: str) -> tuple[int, int, str, float] | None:
    """(parent pid, session id, command name, CPU seconds of the process and its reaped
    children) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]  # may hold spaces and parentheses
    fields = text[text.rindex(")") + 2:].split()  # fields[k] is field k + 3 of proc(5)
    # ppid, session; utime, stime, cutime, cstime (fields 14-17)
    return int(fields[1]), int(fields[3]), name, sum(int(v) for v in fields[11:15]) * _TICK_S


def tree_cpu_s(root: int | None = None) -> dict[str, float]:
    """CPU seconds so far of this process tree by role: ``driver`` (``root``, this process by
    default), ``jvm`` (its ``java`` descendants: Spark's JVM) and ``workers`` (every other
    descendant: Spark's Python workers). Only descendants in ``root``'s session count: the
    services a benchmark starts itself (Kafka's broker, Redis) run in sessions of their own.
    A process counts its reaped children, so a worker that ended still counts in its
    parent's figure, while that one lives."""
    root = os.getpid() if root is None else root
    stats = {int(pid): s for pid in os.listdir("/proc") if pid.isdigit()
             if (s := _stat(pid)) is not None}
    if root not in stats:
        raise ValueError(f"no process {root}")
    session = stats[root][1]
    children: dict[int, list[int]] = {}
    for pid, (parent, _session, _name, _cpu) in stats.items():
        children.setdefault(parent, []).append(pid)
    roles = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    todo = [root]
    while todo:
        pid = todo.pop()
        _parent, its_session, name, cpu = stats[pid]
        if its_session != session:
            continue
        roles["driver" if pid == root else "jvm" if name == "java" else "workers"] += cpu
        todo.extend(child for child in children.get(pid, ()) if child in stats)
    return roles


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds so far, every process on every core."""
    return _read()[0] * _TICK_S
