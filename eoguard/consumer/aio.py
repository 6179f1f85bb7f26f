"""AsyncGuardedConsumer: the GuardedConsumer for asyncio applications, with async handlers.

A front over one :class:`~eoguard.consumer.guarded.GuardedConsumer` run on a thread of its
own, not a second consumer: the same pipeline (claim -> handle -> done -> commit), claim
policy, leases, retries, dead letters and rebalance handling, so each rule stays in one
place. Why a thread and not redis.asyncio with confluent-kafka's async consumer: that would
be a second pipeline, a second set of round trips, leases and rebalance hooks to keep equal to
the first, and the pipeline's overlap of Redis round trips with the consumer's own work is
what a coroutine port would have to rebuild; what an event loop needs from a consumer is that
its handlers run on the loop and that nothing else does.

* **What runs where.** The consumer thread polls Kafka, decodes, claims, marks done and
  commits (blocking calls, never on the loop). Its handler step is a batch handler that hands
  the batch's contexts to the loop (``run_coroutine_threadsafe``) and waits: on the loop a
  :class:`~eoguard.consumer.lanes.LaneRunner` awaits the application's handler, up to
  ``concurrency`` at a time, in key order if asked, each within ``handler_timeout_s``. What
  failed is returned as a batch handler returns it; the pipeline goes on as for any batch.
  Expiry is re-checked once before the batch's handlers start, as for a batch handler: a
  handler that runs long can read ``ctx.envelope.expires_at_ms``.
* **``await consumer.run()``** handles messages until cancelled, then closes the consumer.
  ``async for ctx in consumer`` hands the messages to the loop's body one at a time instead:
  a message counts as handled (its ``ctx.tx`` effects and outputs go with its done mark)
  once the body asks for the next one; leaving the loop (``break``, an exception) gives the
  batch of the message in hand back, unhandled, when the consumer closes (``async with``):
  the messages of that batch the body went past are handled again by the next reader.
* **Cancellation.** Cancelling ``run()`` finishes the batch in flight (its handlers run to
  their end, at most ``handler_timeout_s``), lands its done marks and commits, gives back the
  claims of the batches read ahead (another reader takes them at once), leaves the group, then
  raises CancelledError. Cancelled again meanwhile, or with its handlers cancelled (the loop
  shutting down), the handlers still running are cancelled and their batch is given back
  too: nothing handled stays without its done mark longer than its lease (a batch given back
  mid-retry has its claims lapse after the lease).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import logging
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType

from eoguard.codec import SchemaRegistry
from eoguard.config import ConsumerConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.consumer.lanes import AsyncHandler, LaneRunner, within
from eoguard.consumer.state import ConsumerStats
from eoguard.errors import ConfigError, ConsumerClosedError, StateError
from eoguard.offloop import build_off_loop
from eoguard.store.client import RedisClient

__all__ = ["AsyncGuardedConsumer", "AsyncHandler"]

log = logging.getLogger(__name__)

_WAKE_S = 1.0  # how often the consumer thread, waiting on the loop, checks the loop still runs


_Handover = tuple[HandlerContext, "asyncio.Future[None]", "asyncio.Future[None]"]
"""async for: a message for the body, the future set when the body takes it and the one set
when it asks for the next (handled)."""


class _GivenBack(BaseException):
    """Raised on the consumer thread when a batch's handlers were cancelled: it leaves the
    batch handler (which fails the batch on an Exception; this is no failure) and the poll,
    and the consumer's close gives the batch back."""


class _Lifecycle(enum.Enum):
    NEW = "new"  # constructed: nothing connected yet
    STARTING = "starting"
    STARTED = "started"  # connected; run() or async for may begin
    RUNNING = "running"  # the consumer thread polls
    CLOSED = "closed"


class AsyncGuardedConsumer:
    """A GuardedConsumer whose handler is awaited on an asyncio event loop (module doc).

    ``handler`` (an ``async def`` taking a :class:`HandlerContext`) for :meth:`run`, or none
    for ``async for``. ``concurrency`` handlers of a batch run at once; with
    ``keep_key_order`` two messages of one Kafka key never run at once and run in offset
    order; a handler running past ``handler_timeout_s`` (None: no limit) is cancelled and its
    attempt failed. Construction only keeps its arguments; ``await start()`` (or ``async
    with``) connects on a worker thread and binds the consumer to the running loop.
    """

    def __init__(self, config: ConsumerConfig, *, handler: AsyncHandler | None = None,
                 concurrency: int = 1, keep_key_order: bool = True,
                 handler_timeout_s: float | None = None, redis: RedisClient | None = None,
                 registry: SchemaRegistry | None = None) -> None:
        self.config = config
        self._handler = handler
        # async for hands messages over one at a time: its body is the one handler, timed
        # from when it takes the message (_hand_over), not while it is busy with the one before.
        self._lanes = LaneRunner(handler or self._hand_over,
                                 concurrency=concurrency if handler is not None else 1,
                                 keep_key_order=keep_key_order,
                                 timeout_s=handler_timeout_s if handler is not None else None)
        self._body_timeout_s = handler_timeout_s if handler is None else None
        self._redis, self._registry = redis, registry
        self._state = _Lifecycle.NEW
        self._consumer: GuardedConsumer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()  # the consumer thread stops after its current poll
        self._ended: asyncio.Future[None] | None = None  # the consumer thread's end
        self._batch: asyncio.Task[object] | None = None  # the batch's handlers, on the loop
        self._given_back = False  # handlers cancelled: every batch is given back
        self._stats = ConsumerStats()  # the consumer thread's copy after each poll
        # async for: the message handed to the body, with what its handler waits on
        self._inbox: asyncio.Queue[_Handover] | None = None
        self._in_hand: asyncio.Future[None] | None = None

    # Lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect (a GuardedConsumer built on a worker thread); raises what its
        construction raises (:class:`StoreUnavailableError`, :class:`ConfigError`...)."""
        if self._state is not _Lifecycle.NEW:
            raise ConsumerClosedError(f"start() on a consumer that is {self._state.value}")
        self._state = _Lifecycle.STARTING
        self._loop = asyncio.get_running_loop()
        try:  # cancelled: the consumer its thread goes on building is closed, not leaked
            consumer = await build_off_loop(functools.partial(
                GuardedConsumer, self.config, batch_handler=self._handle_batch,
                redis=self._redis, registry=self._registry))
        except BaseException:
            self._state = _Lifecycle.CLOSED
            raise
        if self._state is _Lifecycle.CLOSED:  # close() was called while it started
            await asyncio.to_thread(consumer.close)
            raise ConsumerClosedError("the consumer was closed while it started")
        self._consumer, self._state = consumer, _Lifecycle.STARTED

    async def close(self) -> None:
        """Stop: a run in progress finishes its batch in flight (``async for``: the message in
        hand is given back) and closes the consumer; else the consumer closes on a worker
        thread (GuardedConsumer.close: claims given back, group left)."""
        if self._state is _Lifecycle.CLOSED:
            return
        state, self._state = self._state, _Lifecycle.CLOSED
        if state is _Lifecycle.RUNNING and self._ended is not None:
            self._stop.set()
            if self._handler is None:  # the body left the loop: its message goes back
                self._give_back()
            await asyncio.wait({self._ended})  # the thread closes; run() raises its error
        elif self._consumer is not None:
            await asyncio.to_thread(self._consumer.close)

    async def __aenter__(self) -> AsyncGuardedConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # Running -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Handle messages until cancelled (or closed), then close the consumer.

        Cancelled: as in the module docstring (the batch in flight finished, the rest given
        back), then CancelledError is raised. Raises what a poll raises for good, after
        closing: :class:`ConsumerFencedError`, :class:`SecurityError`.
        """
        if self._handler is None:
            raise ConfigError("run() needs a handler=; without one, iterate: async for ctx "
                              "in consumer")
        await self._run(self._begin())

    def __aiter__(self) -> AsyncIterator[HandlerContext]:
        if self._handler is not None:
            raise ConfigError("async for needs a consumer without a handler= (it has one: "
                              "await consumer.run())")
        return self._messages()

    async def _messages(self) -> AsyncIterator[HandlerContext]:
        """The messages one at a time; the one in hand counts as handled when the next is
        asked for (module docstring)."""
        consumer = self._begin()  # first: a second async for, refused, takes nothing over
        inbox: asyncio.Queue[_Handover] = asyncio.Queue()
        self._inbox = inbox
        running = asyncio.ensure_future(self._run(consumer))
        getting: asyncio.Future[_Handover] | None = None
        try:
            while True:
                if self._in_hand is not None and not self._in_hand.done():
                    self._in_hand.set_result(None)  # handled: its done mark goes out
                getting = asyncio.ensure_future(inbox.get())
                await asyncio.wait({getting, running}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    await running  # the run ended: raises its error, if any
                    return
                ctx, taken, handled = getting.result()
                if taken.done():  # its batch was given back meanwhile: not the body's
                    continue
                taken.set_result(None)  # its handler's timeout starts now
                self._in_hand = handled
                yield ctx
        finally:
            if getting is not None:
                getting.cancel()
            if not running.done():  # left the loop: the message in hand goes back
                self._give_back()

    def _begin(self) -> GuardedConsumer:
        """The consumer to run, now RUNNING; raises when run() or async for may not start
        (not started, closed, running already, another loop than start()'s)."""
        consumer = self._consumer
        if self._state is not _Lifecycle.STARTED or consumer is None:
            raise self._not_ready()
        if asyncio.get_running_loop() is not self._loop:  # its batches: to a loop not run
            raise StateError("run() or async for on another event loop than start()'s: "
                             "start and run the consumer on one loop")
        self._state = _Lifecycle.RUNNING
        return consumer

    async def _run(self, consumer: GuardedConsumer) -> None:
        loop = asyncio.get_running_loop()
        ended = self._ended = loop.create_future()
        threading.Thread(target=self._poll_until_stopped, args=(consumer, loop, ended),
                         name=f"eoguard-async-consumer-{consumer.instance_id}").start()
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            self._stop.set()  # the batch in flight is finished first
            while not ended.done():
                try:
                    await asyncio.shield(ended)
                except asyncio.CancelledError:  # cancelled again: give it back now
                    self._give_back()
            if ended.exception() is not None:  # the cancellation is what run() raises
                log.warning("the consumer stopped with an error while run() was cancelled",
                            exc_info=ended.exception())
            raise
        finally:
            self._state = _Lifecycle.CLOSED

    def _poll_until_stopped(self, consumer: GuardedConsumer, loop: asyncio.AbstractEventLoop,
                            ended: asyncio.Future[None]) -> None:
        """The consumer thread: poll until stopped (or the loop is gone), then close."""
        error: BaseException | None = None
        try:
            while not self._stop.is_set() and not loop.is_closed():
                consumer.poll_once()
                self._stats = consumer.stats()
        except _GivenBack:
            pass  # close() gives the batch back
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised by run()
            error = exc
        try:
            consumer.close()
        except _GivenBack:  # a retry of a batch landing at close: its claims lapse
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised by run()
            error = error or exc
        self._stats = consumer.stats()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, ended, error)

    def _handle_batch(self, contexts: Sequence[HandlerContext]) -> Mapping[str, BaseException]:
        """The consumer's batch handler, on its thread: the batch's handlers run on the loop
        while this waits; raises _GivenBack when they were cancelled."""
        loop = self._loop
        if self._given_back or loop is None:
            raise _GivenBack
        batch = self._run_batch(contexts)
        try:
            future = asyncio.run_coroutine_threadsafe(batch, loop)
        except RuntimeError:  # the loop is closed
            batch.close()  # never run: closed, so Python does not warn it was not awaited
            raise _GivenBack from None
        while True:
            try:
                return future.result(_WAKE_S)
            except concurrent.futures.TimeoutError:
                if loop.is_closed() or not loop.is_running():  # nobody will run them now
                    future.cancel()
                    raise _GivenBack from None
            except concurrent.futures.CancelledError:
                raise _GivenBack from None

    async def _run_batch(self, contexts: Sequence[HandlerContext]) -> dict[str, BaseException]:
        self._batch = asyncio.current_task()
        try:
            if self._given_back:
                raise asyncio.CancelledError
            return await self._lanes.run(contexts)
        finally:
            self._batch = None

    def _give_back(self) -> None:
        """Cancel the handlers running (the message in hand, for async for): their batch,
        and every later one, is given back."""
        self._given_back = True
        self._stop.set()
        if self._batch is not None:
            self._batch.cancel()

    async def _hand_over(self, ctx: HandlerContext) -> None:
        """async for's handler: hand ``ctx`` to the body, wait until it asks for the next."""
        assert self._inbox is not None
        loop = asyncio.get_running_loop()
        taken: asyncio.Future[None] = loop.create_future()
        handled: asyncio.Future[None] = loop.create_future()
        self._inbox.put_nowait((ctx, taken, handled))
        await taken  # the body may still be on a message whose time ran out
        if self._body_timeout_s is None:
            await handled
        else:
            await within(handled, self._body_timeout_s)

    # The rest, as GuardedConsumer's --------------------------------------------------------
    def stats(self) -> ConsumerStats:
        """The counters: once run, as of the consumer thread's last poll (or its close)."""
        if self._ended is not None or self._consumer is None:  # the thread's to read
            return self._stats
        return self._consumer.stats()

    @property
    def instance_id(self) -> str:
        if self._consumer is None:
            raise self._not_ready()
        return self._consumer.instance_id

    def _not_ready(self) -> StateError:
        if self._state is _Lifecycle.CLOSED:
            return ConsumerClosedError("the consumer is closed")
        if self._state is _Lifecycle.RUNNING:
            return StateError("the consumer runs already (one run() or async for at a time)")
        return ConsumerClosedError("not started: await consumer.start() or use async with")

    def __repr__(self) -> str:
        return (f"AsyncGuardedConsumer(scope={self.config.scope!r}, "
                f"concurrency={self._lanes.concurrency}, state={self._state.value})")


def _settle(ended: asyncio.Future[None], error: BaseException | None) -> None:
    if ended.done():
        return
    if error is None:
        ended.set_result(None)
    else:
        ended.set_exception(error)
