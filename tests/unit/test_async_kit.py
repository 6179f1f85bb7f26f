"""tests/async_kit.run fails a step that slept on the loop, and only such a step."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.async_kit import run


async def _sleeps_on_the_loop() -> None:
    await asyncio.sleep(0)
    time.sleep(0.3)  # a blocking call in a task step


async def _a_callback_sleeps() -> None:
    done = asyncio.get_running_loop().create_future()

    def blocking() -> None:
        time.sleep(0.3)
        done.set_result(None)

    asyncio.get_running_loop().call_soon(blocking)
    await done


async def _busy_then_awaits() -> int:
    until = time.thread_time() + 0.3  # 0.3 s of CPU in one step: slow, but not blocked
    spins = 0
    while time.thread_time() < until:
        spins += 1
    await asyncio.sleep(0.2)  # a long await: the loop sleeps in select, between steps
    return spins


@pytest.mark.parametrize("blocks", [_sleeps_on_the_loop, _a_callback_sleeps])
def test_a_step_that_sleeps_fails_the_run(blocks) -> None:
    with pytest.raises(AssertionError, match="blocked the event loop"):
        run(blocks())


def test_a_step_that_computes_long_and_an_await_that_waits_long_pass() -> None:
    assert run(_busy_then_awaits()) > 0
