"""Running the async producer's tests on an event loop in debug mode that fails on a slow step.

asyncio's debug mode logs "Executing <step> took N seconds" (logger ``asyncio``) for every
callback or task step that ran longer than ``loop.slow_callback_duration``; :func:`run`
sets that to 100 ms and fails the test when such a line was logged: something blocked the
loop. A :class:`Ticker` counts how often a task woke while the test ran, to show the loop
kept turning during a long await (close, a full queue). The check measures wall time, so a
machine starved of CPU can still trip it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

SLOW_CALLBACK_S = 0.1

T = TypeVar("T")


class _SlowSteps(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("Executing "):
            self.lines.append(text)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a new loop in debug mode; fail if any step blocked it over 100 ms."""
    slow = _SlowSteps()
    logger = logging.getLogger("asyncio")
    logger.addHandler(slow)
    try:
        loop = asyncio.new_event_loop()  # (asyncio.Runner is 3.11+)
        loop.set_debug(True)
        loop.slow_callback_duration = SLOW_CALLBACK_S
        # A full collection of a test process's heap (after hundreds of tests) can take over
        # 100 ms in whichever step triggers it: a pause of the interpreter, not a call that
        # blocked the loop. Collected before and after instead.
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
    finally:
        logger.removeHandler(slow)
    assert not slow.lines, f"the event loop was blocked over {SLOW_CALLBACK_S} s: {slow.lines}"
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
