"""How the async consumer runs its handler over a batch: some at a time, in key order if asked.

A batch's contexts are split into *lanes*: with ``keep_key_order`` one lane per Kafka key, in
the batch's order (a record without a key is a lane of its own), else one lane per message.
Up to ``concurrency`` workers take the lanes one after another and run a lane's handlers one
at a time, so two messages of one key never run at once and run in offset order (a key's
records share a partition). With one worker nothing is spawned: the handlers are awaited in
turn by the run itself.

A handler that raises, or runs past ``timeout_s`` (it is cancelled then), fails its message
only: the run returns it with its error, as a batch handler returns its failed ids. With
``keep_key_order`` the later messages of its lane are not run: they are returned
:class:`~eoguard.consumer.handler.Deferred`, retried with it in batch order without an attempt
counted against them, so a key's messages are handled in offset order whatever fails (a
message dead-lettered past ``max_retries`` no longer holds its key back). A cancellation is no
failure: it cancels
every handler still running and is raised (the caller gives the batch back). A handler
raising CancelledError of its own (it awaited something another task cancelled), its task not
cancelled, fails its attempt like any error: it does not stop the consumer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from eoguard.consumer.handler import Deferred, HandlerContext
from eoguard.errors import ConfigError

__all__ = ["AsyncHandler", "LaneRunner", "within"]

AsyncHandler = Callable[[HandlerContext], Awaitable[None] | None]
"""Handles one message on the event loop: an ``async def`` (or a plain ``def``, run on the
loop: keep it short); raising, or running past the timeout, fails this attempt."""

_Lanes = deque[list[HandlerContext]]


class LaneRunner:
    """Runs ``handler`` over a batch's contexts with the concurrency and order of the module
    docstring; :meth:`run` returns the failed message ids with their errors."""

    def __init__(self, handler: AsyncHandler, *, concurrency: int, keep_key_order: bool,
                 timeout_s: float | None) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        if timeout_s is not None and timeout_s <= 0:
            raise ConfigError(f"handler_timeout_s must be positive or None, got {timeout_s}")
        self._handler = handler
        self.concurrency = concurrency
        self.keep_key_order = keep_key_order
        self.timeout_s = timeout_s

    async def run(self, contexts: Sequence[HandlerContext]) -> dict[str, BaseException]:
        """Every context's handler once; the failed ones by message id. Cancelled (or a
        worker task cancelled by someone else): every handler still running is cancelled and
        CancelledError raised."""
        errors: dict[str, BaseException] = {}
        lanes = self._lanes(contexts)
        workers = min(self.concurrency, len(lanes))
        if workers <= 1:
            await self._work(lanes, errors)
            return errors
        tasks = [asyncio.ensure_future(self._work(lanes, errors)) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # cancelled, or a worker was: no handler outlives its run
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise
        return errors

    def _lanes(self, contexts: Sequence[HandlerContext]) -> _Lanes:
        if not self.keep_key_order:
            return deque([ctx] for ctx in contexts)
        by_key: dict[bytes, list[HandlerContext]] = {}
        lanes: _Lanes = deque()
        for ctx in contexts:
            key = ctx.key
            if key is None:
                lanes.append([ctx])
            elif (lane := by_key.get(key)) is not None:
                lane.append(ctx)
            else:
                lanes.append(by_key.setdefault(key, [ctx]))
        return lanes

    async def _work(self, lanes: _Lanes, errors: dict[str, BaseException]) -> None:
        """Take lanes until none is left; a lane's handlers one after another."""
        while lanes:
            failed: str | None = None  # the lane's first failed message: the rest wait for it
            for ctx in lanes.popleft():
                if failed is not None:
                    errors[ctx.message_id] = Deferred(f"waits behind {failed}, which failed")
                    continue
                error = await self._attempt(ctx)
                if error is not None:
                    errors[ctx.message_id] = error
                    failed = ctx.message_id

    async def _attempt(self, ctx: HandlerContext) -> BaseException | None:
        """One handler call: None when it succeeded, else what failed it."""
        try:
            if self.timeout_s is None:
                await self._call(ctx)
            else:
                await self._call_within(ctx, self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - any handler error fails this attempt
            return exc
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                raise
            return exc  # the handler's own (it awaited something cancelled): a failure
        return None

    async def _call_within(self, ctx: HandlerContext, timeout_s: float) -> None:
        await within(self._call(ctx), timeout_s)

    async def _call(self, ctx: HandlerContext) -> None:
        returned = self._handler(ctx)
        if returned is not None:
            await returned


async def within(handling: Awaitable[object], timeout_s: float) -> None:
    """Await a handler's ``handling`` up to ``timeout_s``; past it, it is cancelled and
    TimeoutError raised (the attempt fails)."""
    try:
        await asyncio.wait_for(handling, timeout_s)
    except asyncio.TimeoutError as exc:  # wait_for's: it cancelled the handler
        raise TimeoutError(f"the handler ran past handler_timeout_s ({timeout_s} s) and "
                           "was cancelled") from exc


def _cancelled_from_outside() -> bool:
    """Whether the task running the handler is being cancelled (the run, the loop shutting
    down), not the handler raising CancelledError of its own. Python 3.10 cannot tell the
    two apart (no ``Task.cancelling``): every CancelledError counts as from outside."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0
