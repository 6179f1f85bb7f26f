"""AsyncGuardedProducer: the GuardedProducer for asyncio applications.

An async front over one :class:`~eoguard.producer.guarded.GuardedProducer`: the same ledger,
engine, modes, outbox, recovery and adaptive delay, so the rules stay in one place. What the
front adds is how an event loop learns a message's fate and that it never blocks the loop:

* ``await send(...)`` returns the message id once the message is guaranteed, or raises the
  error it failed with; :meth:`AsyncGuardedProducer.send_nowait` returns that future at once.
* Every message the front sends carries one bridge as its callbacks: eoguard's callback
  thread appends the settled message to a deque and wakes the loop once per batch
  (``call_soon_threadsafe``); on the loop the application's callbacks run (a plain ``def``
  is called there, an ``async def`` becomes a task) and then the message's future resolves.
* A cancelled ``await`` cancels only the wait: the message is still guaranteed or failed,
  and its callbacks still fire.
* What may block (connecting and recovering at start, waiting for room in a full queue,
  flush, close) runs on a worker thread (``asyncio.to_thread``), never on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple

from eoguard.codec import SchemaRegistry
from eoguard.config import ProducerConfig
from eoguard.errors import BackpressureError, EoguardError, PersistError, ProducerClosedError
from eoguard.offloop import build_off_loop
from eoguard.producer.guarded import GuardedProducer
from eoguard.producer.messages import PendingMessage, ProducerStats, SendHandle
from eoguard.producer.recovery import RecoveryReport

__all__ = ["AsyncFailedCallback", "AsyncGuardedCallback", "AsyncGuardedProducer"]

log = logging.getLogger(__name__)

AsyncGuardedCallback = Callable[[SendHandle], Awaitable[None] | None]
"""``on_guaranteed`` of the async producer: a plain or an ``async def`` function."""
AsyncFailedCallback = Callable[[SendHandle, EoguardError], Awaitable[None] | None]
"""``on_failed`` of the async producer: a plain or an ``async def`` function."""

# One drain step's budget on the loop: thousands of messages settled at once (with a callback
# each) are spread over several steps, so no step holds the loop for long.
_DRAIN_STEP_S = 0.005

_Waiter = tuple[asyncio.Future[str], AsyncGuardedCallback | None, AsyncFailedCallback | None]


class _Request(NamedTuple):
    """One send's arguments, as GuardedProducer.send takes them."""

    topic: str
    value: Any
    key: bytes | str | None
    ttl_s: float | None
    schema: str | None
    headers: Mapping[str, str] | None
    message_id: str | None
    on_guaranteed: AsyncGuardedCallback | None
    on_failed: AsyncFailedCallback | None


class _Lifecycle(enum.Enum):
    NEW = "new"  # constructed: nothing connected yet
    STARTING = "starting"
    RUNNING = "running"
    CLOSED = "closed"


class AsyncGuardedProducer:
    """A GuardedProducer whose sends are awaited on an asyncio event loop (module doc).

    Construction only keeps its arguments; ``await start()`` (or ``async with``) connects,
    registers the liveness lease and recovers on a worker thread, and binds the producer to
    the running loop: send from that loop only. Callbacks may be plain or ``async def``
    functions; both run on that loop (a plain one there and then: keep it short).
    """

    def __init__(self, config: ProducerConfig, *, registry: SchemaRegistry | None = None,
                 on_guaranteed: AsyncGuardedCallback | None = None,
                 on_failed: AsyncFailedCallback | None = None) -> None:
        self.config = config
        self._registry = registry
        self._on_guaranteed = on_guaranteed
        self._on_failed = on_failed
        self._state = _Lifecycle.NEW
        self._producer: GuardedProducer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[SendHandle, _Waiter] = {}
        self._settled: collections.deque[tuple[SendHandle, EoguardError | None]] = (
            collections.deque())
        self._drain_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()  # async callbacks still running
        self.callback_errors = 0

    # Lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and recover (on a worker thread); raises what GuardedProducer's
        construction raises (:class:`StoreUnavailableError`, :class:`ConfigError`...)."""
        if self._state is not _Lifecycle.NEW:
            raise ProducerClosedError(f"start() on a producer that is {self._state.value}")
        self._state = _Lifecycle.STARTING
        self._loop = asyncio.get_running_loop()
        try:  # cancelled: the producer its thread goes on building is closed, not leaked
            producer = await build_off_loop(functools.partial(
                GuardedProducer, self.config, registry=self._registry,
                on_guaranteed=self._guaranteed, on_failed=self._failed))
        except BaseException:
            self._state = _Lifecycle.CLOSED
            raise
        if self._state is _Lifecycle.CLOSED:  # close() was called while it started
            await asyncio.to_thread(producer.close)
            raise ProducerClosedError("the producer was closed while it started")
        self._producer, self._state = producer, _Lifecycle.RUNNING

    async def close(self, timeout_s: float = 30.0) -> None:
        """Flush for up to ``timeout_s`` and stop (GuardedProducer.close, on a worker
        thread); then run the last callbacks and wait for the async ones still running."""
        if self._state is _Lifecycle.CLOSED:
            return
        producer, self._state = self._producer, _Lifecycle.CLOSED
        if producer is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await asyncio.to_thread(producer.close, timeout_s)
        while self._settled:  # what the callback thread posted before it stopped
            self._drain()
            await asyncio.sleep(0)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(deadline - loop.time(), 1.0))

    async def __aenter__(self) -> AsyncGuardedProducer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # Sending ---------------------------------------------------------------------------
    async def send(self, topic: str, value: Any, key: bytes | str | None = None, *,
                   ttl_s: float | None = None, schema: str | None = None,
                   headers: Mapping[str, str] | None = None, message_id: str | None = None,
                   on_guaranteed: AsyncGuardedCallback | None = None,
                   on_failed: AsyncFailedCallback | None = None) -> str:
        """Send one message and return its id once it is guaranteed.

        The arguments and the errors raised at once are GuardedProducer.send's; while the
        queue is full this waits (off the loop) up to ``send_timeout_s`` for room. Then it
        raises what the message failed with: :class:`PersistError` (expired before it
        could be persisted), :class:`BrokerError` (refused by Kafka) or
        :class:`ProducerClosedError` (closed first). Cancelling the await leaves the message
        as it is: still guaranteed or failed, its callbacks fired.
        """
        request = _Request(topic, value, key, ttl_s, schema, headers, message_id,
                           on_guaranteed, on_failed)
        registry_call = self._running("send")._registry_call(topic, schema)  # the front's half
        if registry_call is not None:  # a schema's first send in the header wire format
            await asyncio.to_thread(registry_call)
        try:
            future = self._send(request)
        except (BackpressureError, PersistError):  # the queue is full: wait for room
            future = await self._send_waiting(request)
        return await future

    def send_nowait(self, topic: str, value: Any, key: bytes | str | None = None, *,
                    ttl_s: float | None = None, schema: str | None = None,
                    headers: Mapping[str, str] | None = None, message_id: str | None = None,
                    on_guaranteed: AsyncGuardedCallback | None = None,
                    on_failed: AsyncFailedCallback | None = None) -> asyncio.Future[str]:
        """Send one message; return at once a future of its id, resolved once the message is
        guaranteed (or failed with its error, as :meth:`send` raises it).

        Never waits: a full queue raises :class:`BackpressureError` (persist-first with the
        outbox unreachable: :class:`PersistError`) at once, as ``asyncio.Queue.put_nowait``
        does. Cancelling the future cancels only the wait, as with :meth:`send`. But a
        schema's first send to a topic in the header wire format asks Schema Registry for its
        id: that send is :meth:`send` run as a task (the call on a worker thread), its future
        returned, and its errors come through that future.
        """
        if self._running("send")._registry_call(topic, schema) is not None:  # the front's half
            return asyncio.ensure_future(self.send(
                topic, value, key, ttl_s=ttl_s, schema=schema, headers=headers,
                message_id=message_id, on_guaranteed=on_guaranteed, on_failed=on_failed))
        return self._send(_Request(topic, value, key, ttl_s, schema, headers, message_id,
                                   on_guaranteed, on_failed))

    def _send(self, request: _Request) -> asyncio.Future[str]:
        """The message admitted at once (the full queue's error raised at once), its future."""
        producer, msg, future = self._prepare(request)
        try:
            producer._admit(msg, wait=False)  # the front's half of send
        except BaseException:
            del self._waiters[msg]
            raise
        return future

    async def _send_waiting(self, request: _Request) -> asyncio.Future[str]:
        """The message built anew (the refused one may have been withdrawn) and admitted on
        a worker thread, which waits for room up to ``send_timeout_s``."""
        producer, msg, future = self._prepare(request)

        def admit() -> None:  # on the worker thread: runs on even if the await is cancelled
            try:
                producer._admit(msg, wait=True)  # the front's half of send
            except BaseException:
                self._waiters.pop(msg, None)  # one dict operation: atomic under the GIL
                raise

        await asyncio.to_thread(admit)
        return future

    def _prepare(self, request: _Request,
                 ) -> tuple[GuardedProducer, PendingMessage, asyncio.Future[str]]:
        """The checked message and its future, registered before it is admitted (its
        settlement may be posted by another thread before admission returns)."""
        producer, loop = self._producer, self._loop
        if self._state is not _Lifecycle.RUNNING or producer is None or loop is None:
            raise self._not_running("send")
        msg = producer._message(  # the front's half of send
            request.topic, request.value, request.key, ttl_s=request.ttl_s,
            schema=request.schema, headers=request.headers, message_id=request.message_id,
            on_guaranteed=self._guaranteed, on_failed=self._failed)
        future: asyncio.Future[str] = loop.create_future()
        self._waiters[msg] = (future, request.on_guaranteed or self._on_guaranteed,
                              request.on_failed or self._on_failed)
        return producer, msg, future

    # From eoguard's callback thread to the loop ------------------------------------------
    def _guaranteed(self, handle: SendHandle) -> None:
        self._post(handle, None)

    def _failed(self, handle: SendHandle, error: EoguardError) -> None:
        self._post(handle, error)

    def _post(self, handle: SendHandle, error: EoguardError | None) -> None:
        """On the callback thread: queue the settled message; wake the loop unless a drain
        is already scheduled (one wake-up per batch, not per message)."""
        self._settled.append((handle, error))
        if self._drain_scheduled:
            return
        self._drain_scheduled = True
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            log.warning("message %s settled after its event loop closed; its async "
                        "callbacks and future are dropped (close the producer first)", handle.id)

    def _drain(self) -> None:
        """On the loop: each settled message's callback, then its future; for at most
        ``_DRAIN_STEP_S``, then again at the loop's next turn (other tasks run between)."""
        self._drain_scheduled = False  # before reading: a message posted now wakes again
        settled, waiters = self._settled, self._waiters
        loop = self._loop
        assert loop is not None
        deadline = loop.time() + _DRAIN_STEP_S
        count = 0
        while settled:
            count += 1
            if not count & 15 and loop.time() > deadline:
                if not self._drain_scheduled:
                    self._drain_scheduled = True
                    loop.call_soon(self._drain)
                return
            handle, error = settled.popleft()
            waiter = waiters.pop(handle, None)
            if waiter is None:
                continue
            future, on_guaranteed, on_failed = waiter
            if error is None:
                if on_guaranteed is not None:
                    self._run(on_guaranteed, handle)
                if not future.done():  # done: its await was cancelled
                    future.set_result(handle.id)
            else:
                if on_failed is not None:
                    self._run(on_failed, handle, error)
                if not future.done():
                    future.set_exception(error)

    def _run(self, callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
        """Call an application callback on the loop; an awaitable it returns runs as a task.
        What it raises is logged and counted: an application bug never changes a message's
        guarantee."""
        try:
            returned = callback(*args)
        except Exception:
            self.callback_errors += 1
            log.exception("a callback of message %s raised; ignored", args[0].id)
            return
        if inspect.isawaitable(returned):
            task = asyncio.ensure_future(returned)
            self._tasks.add(task)
            task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.callback_errors += 1
            log.error("an async callback raised; ignored", exc_info=task.exception())

    # The rest, as GuardedProducer's --------------------------------------------------------
    async def flush(self, timeout_s: float | None = None) -> int:
        """GuardedProducer.flush on a worker thread: how many messages are outstanding."""
        return await asyncio.to_thread(self._running().flush, timeout_s)

    async def recover(self) -> RecoveryReport:
        """GuardedProducer.recover on a worker thread."""
        return await asyncio.to_thread(self._running().recover)

    async def resend(self, message_ids: Sequence[str]) -> RecoveryReport:
        """GuardedProducer.resend on a worker thread."""
        return await asyncio.to_thread(self._running().resend, message_ids)

    def stats(self) -> ProducerStats:
        """Counters since start, the current delay and the queue depth (never blocks)."""
        return self._running().stats()

    @property
    def instance_id(self) -> str:
        return self._running().instance_id

    def _running(self, what: str = "a call") -> GuardedProducer:
        """The producer, once started (after close too: it refuses what it must itself)."""
        if self._producer is None:
            raise self._not_running(what)
        return self._producer

    def _not_running(self, what: str) -> ProducerClosedError:
        if self._state is _Lifecycle.CLOSED:
            return ProducerClosedError(f"{what} after close")
        return ProducerClosedError(
            f"{what} before start(): await producer.start() or use async with")

    def __repr__(self) -> str:
        return (f"AsyncGuardedProducer(mode={self.config.mode.value!r}, "
                f"state={self._state.value})")
