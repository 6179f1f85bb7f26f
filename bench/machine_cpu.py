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

__all__ = ["MachineCpu", "redis_cpu_s"]

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
