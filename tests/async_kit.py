"""Running the async tests on an event loop that fails when a step *blocked* it.

A step (a callback, or one step of a task) that blocks the loop sleeps in the kernel: on a
socket, a lock, ``time.sleep``. :func:`run` times every step on the loop's thread and takes
from its wall time what the kernel says the thread spent running and waiting for a CPU
(``/proc/thread-self/schedstat``); what is left is time the thread slept, and a step that
slept over 100 ms fails the test. A machine starved of CPU stretches a step's wall time but
not its sleep, so the check does not depend on how busy the machine is (a wall-time check
did: a step took 127 ms at load 7.5 on two cores without blocking anything). The loop runs in
asyncio's debug mode too, which raises on a call from the wrong thread.

A :class:`Ticker` counts how often a task woke while the test ran, to show the loop kept
turning during a long await (close, a full queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

BLOCKED_STEP_S = 0.1

T = TypeVar("T")


class _SleepMeter:
    """Sleep time of the thread that made it: wall time less running and run-queue time."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def now(self) -> tuple[float, int]:
        """(wall seconds, running + waiting-for-a-CPU nanoseconds) so far."""
        running, waiting = os.pread(self._fd, 128, 0).split()[:2]
        return time.monotonic(), int(running) + int(waiting)

    def close(self) -> None:
        os.close(self._fd)


class _BlockedSteps:
    """Wraps every asyncio step run on the thread that built it; keeps those that slept."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.meter = _SleepMeter()
        self.lines: list[str] = []
        self._run: Callable[[asyncio.Handle], None] = asyncio.Handle._run

    def __enter__(self) -> _BlockedSteps:
        watch, original, meter, lines = self.thread, self._run, self.meter, self.lines

        def timed(handle: asyncio.Handle) -> None:
            if threading.get_ident() != watch:
                original(handle)
                return
            wall, busy = meter.now()
            try:
                original(handle)
            finally:
                wall_end, busy_end = meter.now()
                slept = (wall_end - wall) - (busy_end - busy) / 1e9
                if slept > BLOCKED_STEP_S:
                    lines.append(f"{handle!r} slept {slept:.3f} s of {wall_end - wall:.3f} s")

        asyncio.Handle._run = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.Handle._run = self._run  # type: ignore[method-assign]
        self.meter.close()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a new loop in debug mode; fail if any step slept over 100 ms."""
    with _BlockedSteps() as blocked:
        loop = asyncio.new_event_loop()  # (asyncio.Runner is 3.11+)
        loop.set_debug(True)
        loop.slow_callback_duration = 3600.0  # debug mode's wall-time warning: not used
        # A full collection can close sockets in whichever step triggers it; collected before
        # and after instead.
        gc.collect()
        gc.disable()
        try:
            result = loop.run_until_complete(main)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            gc.enable()
            gc.collect()
    assert not blocked.lines, f"a step blocked the event loop over {BLOCKED_STEP_S} s: {blocked.lines}"
    return result


class Ticker:
    """A task that wakes every ``interval_s`` and counts its wake-ups until stopped."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.ticks = 0
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.ticks += 1

    async def stop(self) -> int:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.ticks
