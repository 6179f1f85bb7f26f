"""The adaptive delay of the ``delayed`` mode, as pure logic.

A message Kafka acknowledges within the delay is never written to Redis; one still
unacknowledged when the delay ends is. So the delay should be just long enough for nearly
every acknowledgement to land inside it, and it is computed from live metrics:

1. Ack latency: ``headroom`` times the observed p99 (never below the p50 times
   ``headroom``). Before any acknowledgement was seen, the maximum (nothing is known yet).
2. Sending clients: every live producer persisting at once competes for the same Redis,
   so with more of them each waits a little longer before writing (``per_producer`` per
   extra producer, at most ``max_contention`` times the base).
3. Backlog and memory bound: messages wait in memory during the delay. Past
   ``pressure_start`` of the queue bound (messages or bytes, whichever is fuller) the
   delay shrinks linearly to the minimum, so persisting frees memory before senders block.
4. The result is clamped to ``[min_ms, max_ms]``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DelayInputs", "DelayPolicy", "LatencyWindow"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DelayInputs:
    """The live metrics one delay is computed from."""

    ack_p50_ms: float | None
    ack_p99_ms: float | None
    live_producers: int
    backlog_messages: int
    backlog_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DelayPolicy:
    """Maps :class:`DelayInputs` to a delay in milliseconds (see the module docstring)."""

    min_ms: float
    max_ms: float
    max_messages: int
    max_bytes: int
    headroom: float = 2.0
    per_producer: float = 0.1
    max_contention: float = 2.0
    pressure_start: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.min_ms <= self.max_ms:
            raise ValueError(f"need 0 < min_ms <= max_ms, got {self.min_ms}, {self.max_ms}")
        if self.max_messages <= 0 or self.max_bytes <= 0:
            raise ValueError("max_messages and max_bytes must be positive")
        if not 0 <= self.pressure_start < 1:
            raise ValueError("pressure_start must be in [0, 1)")

    def delay_ms(self, m: DelayInputs) -> float:
        # Step 1. Ack latency.
        base = (self.max_ms if m.ack_p99_ms is None
                else self.headroom * max(m.ack_p99_ms, m.ack_p50_ms or 0.0))
        # Step 2. Sending clients.
        extra = max(m.live_producers - 1, 0)
        base *= min(1.0 + self.per_producer * extra, self.max_contention)
        # Step 3. Backlog against the memory bound.
        fill = max(m.backlog_messages / self.max_messages, m.backlog_bytes / self.max_bytes)
        if fill > self.pressure_start:
            room = max(0.0, 1.0 - fill) / (1.0 - self.pressure_start)
            base = self.min_ms + (min(base, self.max_ms) - self.min_ms) * room
        # Step 4. Bounds.
        return min(max(base, self.min_ms), self.max_ms)


class LatencyWindow:
    """The last ``size`` Kafka ack latencies, for percentiles (in ms).

    ``add_s`` is the window's own append (O(1), no Python frame: it runs once per delivery
    report, in seconds as librdkafka reports them); ``percentiles`` sorts the window and is
    meant for the periodic delay update.
    """

    def __init__(self, size: int = 4096) -> None:
        self._samples: collections.deque[float] = collections.deque(maxlen=size)  # seconds
        self.add_s: Callable[[float], None] = self._samples.append

    def add(self, latency_ms: float) -> None:
        self.add_s(latency_ms / 1000.0)

    def __len__(self) -> int:
        return len(self._samples)

    def percentiles(self, *qs: float) -> tuple[float | None, ...]:
        """Nearest-rank percentiles (``q`` in 0..100) of the window; None when empty."""
        data = sorted(self._samples)
        if not data:
            return tuple(None for _ in qs)
        return tuple(1000.0 * data[min(len(data) - 1, max(0, math.ceil(q / 100 * len(data)) - 1))]
                     for q in qs)
