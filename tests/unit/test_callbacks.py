"""The one check that callbacks are synchronous (eoguard.callbacks)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
from collections.abc import Callable

import pytest

from eoguard.callbacks import awaitable_refused, is_async, require_sync
from eoguard.errors import ConfigError, InvalidInputError, InvalidMessageError


def plain(ctx: object) -> None:
    return None


async def coroutine_fn(ctx: object) -> None:
    return None


async def async_gen_fn(ctx: object):  # type: ignore[no-untyped-def]
    yield ctx


def decorated(fn: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(fn)
    def wrapper(*args: object) -> object:
        return fn(*args)
    return wrapper


class AsyncCall:
    async def __call__(self, ctx: object) -> None:
        return None

    async def method(self, ctx: object) -> None:
        return None


class SyncCall:
    def __call__(self, ctx: object) -> None:
        return None

    def method(self, ctx: object) -> None:
        return None


ASYNC = {
    "async def": coroutine_fn,
    "partial of an async def": functools.partial(coroutine_fn),
    "partial of a partial": functools.partial(functools.partial(coroutine_fn)),
    "async generator": async_gen_fn,
    "async __call__": AsyncCall(),
    "partial of an async __call__": functools.partial(AsyncCall()),
    "async bound method": AsyncCall().method,
}
SYNC = {
    "def": plain,
    "lambda": lambda ctx: None,
    "partial": functools.partial(plain),
    "sync __call__": SyncCall(),
    "sync bound method": SyncCall().method,
    "builtin": print,
    "builtin method": [].append,
    "class": SyncCall,
    "sync wrapper of an async def": decorated(coroutine_fn),  # caught when called instead
}


@pytest.mark.parametrize("fn", ASYNC.values(), ids=ASYNC.keys())
def test_async_callables_are_async(fn: object) -> None:
    assert is_async(fn)


@pytest.mark.parametrize("fn", SYNC.values(), ids=SYNC.keys())
def test_sync_callables_are_not(fn: object) -> None:
    assert not is_async(fn)


def test_a_function_marked_or_wrapped_is_judged_by_inspect() -> None:
    # The fast path reads code flags only for functions without attributes; one with some
    # (functools.wraps sets __wrapped__) takes inspect's path and gets the same answer.
    fn = types.FunctionType(coroutine_fn.__code__, globals())
    fn.note = "an attribute"  # type: ignore[attr-defined]
    assert is_async(fn)
    assert is_async(decorated(plain)) is False


def test_require_sync_names_the_callback_and_the_fix() -> None:
    with pytest.raises(ConfigError) as refused:
        require_sync(coroutine_fn, "handler")
    text = str(refused.value)
    assert text.startswith("handler is an async def callable")
    assert "never awaits" in text
    assert "plain def" in text
    assert "asyncio.run(" in text
    assert "\n" not in text


def test_require_sync_raises_the_error_type_it_is_given_and_passes_none_and_sync() -> None:
    with pytest.raises(InvalidMessageError, match="on_failed is an async def callable"):
        require_sync(AsyncCall(), "on_failed", error=InvalidMessageError)
    require_sync(None, "handler")
    require_sync(plain, "handler")


def test_an_awaitable_result_is_refused_and_a_coroutine_closed_unrun() -> None:
    ran: list[bool] = []

    async def work() -> None:
        ran.append(True)

    coro = work()
    refused = awaitable_refused(coro, "handler")
    assert isinstance(refused, InvalidInputError)
    assert not isinstance(refused, ConfigError)  # found when called, not at construction
    assert "handler returned an awaitable (coroutine)" in str(refused)
    assert "plain def" in str(refused)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # no "never awaited"
    assert ran == []


def test_other_awaitables_are_refused_too() -> None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        refused = awaitable_refused(future, "on_guaranteed")
        assert refused is not None
        assert "on_guaranteed returned an awaitable (Future)" in str(refused)
    finally:
        loop.close()


@pytest.mark.parametrize("result", [None, 0, "text", {}, {"id": ValueError()}, [1], iter(())])
def test_other_results_pass(result: object) -> None:
    assert awaitable_refused(result, "handler") is None
