"""The callbacks an application gives eoguard are synchronous: the one check of that rule.

eoguard calls a handler, a batch handler, ``on_guaranteed`` / ``on_failed`` and the Spark
job's hooks on its own threads and never awaits what they return: an ``async def`` callback
would run nothing, yet count as done. :func:`require_sync` refuses one where it is taken
(construction, a ``send`` call); :func:`awaitable_refused` catches a plain callable that
returns an awaitable anyway, when it is called.

The exceptions run on the application's event loop: :class:`eoguard.AsyncGuardedProducer`'s
``on_guaranteed`` / ``on_failed`` (an ``async def`` one is run as a task,
:mod:`eoguard.producer.aio`) and :class:`eoguard.AsyncGuardedConsumer`'s handler (awaited,
:mod:`eoguard.consumer.aio`), so they do not call these.
"""

from __future__ import annotations

import functools
import inspect
from types import BuiltinFunctionType, FunctionType, MethodType

from eoguard.errors import ConfigError, InvalidInputError

__all__ = ["awaitable_refused", "is_async", "require_sync"]

_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR

_FIX = ("eoguard calls it synchronously and never awaits what it returns: make it a plain def "
        "that finishes its work before it returns (run async code to completion inside it, "
        "e.g. with asyncio.run(...) or asyncio.run_coroutine_threadsafe(coro, loop).result())")


def is_async(fn: object) -> bool:
    """True for an ``async def`` function or method, an object whose ``__call__`` is one,
    and a ``functools.partial`` of either."""
    # A plain def, lambda or bound method (what send() is mostly given): its code flags say
    # it, a tenth of inspect's cost. One with attributes (marked or wrapped) asks inspect.
    if type(fn) is MethodType:
        fn = fn.__func__
    if type(fn) is FunctionType and not fn.__dict__:
        return bool(fn.__code__.co_flags & _ASYNC_FLAGS)
    if type(fn) is BuiltinFunctionType:  # C code: never a coroutine function
        return False
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return True
    # An instance with an async __call__ (looked up on its class, as a call does).
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, not callability
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def require_sync(fn: object, what: str, *, error: type[InvalidInputError] = ConfigError,
                 instead: str = "") -> None:
    """Refuse an async callback ``what`` where it is taken: ``error`` (ConfigError at
    construction, InvalidMessageError in a ``send`` call) names it and the fix, and
    ``instead`` what takes an async one. None passes."""
    if fn is not None and is_async(fn):
        also = f"; or {instead}" if instead else ""
        raise error(f"{what} is an async def callable; {_FIX}{also}")


def awaitable_refused(result: object, what: str) -> InvalidInputError | None:
    """The error for a callback ``what`` that returned an awaitable, else None.

    A coroutine is closed unrun first, so Python never warns it was not awaited; the caller
    treats the error as the callback's failure.
    """
    if not inspect.isawaitable(result):
        return None
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()
    return InvalidInputError(f"{what} returned an awaitable ({type(result).__name__}), closed "
                             f"unrun; {_FIX}")
