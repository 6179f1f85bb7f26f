"""Building a blocking client off the event loop, for the asyncio fronts (producer, consumer).

Constructing a GuardedProducer or GuardedConsumer connects and recovers: blocking calls, run
on a worker thread so the loop keeps turning. A start() cancelled meanwhile cannot stop that
thread; what it builds is closed once built, never leaked. The one place of that rule.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = ["Closeable", "build_off_loop"]


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)


async def build_off_loop(build: Callable[[], C]) -> C:
    """``build()`` on a worker thread; cancelled meanwhile, the thread goes on and what it
    builds is closed (on a thread of its own), and CancelledError is raised."""
    building = asyncio.get_running_loop().run_in_executor(None, build)
    try:
        return await asyncio.shield(building)
    except asyncio.CancelledError:
        building.add_done_callback(_close_when_built)
        raise


def _close_when_built(building: asyncio.Future[C]) -> None:
    """Closed on a thread of its own, not the loop's executor (which may be shutting down
    with the loop by then)."""
    if building.cancelled() or building.exception() is not None:
        return
    threading.Thread(target=building.result().close, name="eoguard-close-cancelled-start").start()
