"""LaneRunner, the async consumer's handler step: concurrency, key order, timeouts, cancellation
(pure asyncio: contexts stand in with the two attributes it reads)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from eoguard.consumer.lanes import LaneRunner
from eoguard.errors import ConfigError


@dataclass
class Ctx:
    message_id: str
    key: bytes | None


def contexts(keys: list[bytes | None]) -> list[Ctx]:
    return [Ctx(f"m{i}", key) for i, key in enumerate(keys)]


class Probe:
    """A handler that records start/end per message and the most running at once."""

    def __init__(self, sleep_s: float = 0.001) -> None:
        self.events: list[tuple[str, str]] = []
        self.running = self.most = 0
        self.sleep_s = sleep_s

    async def __call__(self, ctx: Ctx) -> None:
        self.events.append(("start", ctx.message_id))
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(self.sleep_s)
        self.running -= 1
        self.events.append(("end", ctx.message_id))


def test_concurrency_is_bounded_and_every_handler_runs_once() -> None:
    probe = Probe()
    runner = LaneRunner(probe, concurrency=4, keep_key_order=False, timeout_s=None)
    errors = asyncio.run(runner.run(contexts([None] * 20)))
    assert errors == {}
    assert probe.most == 4
    assert sorted(m for kind, m in probe.events if kind == "end") == sorted(f"m{i}"
                                                                           for i in range(20))


def test_one_keys_messages_run_one_after_another_in_order() -> None:
    probe = Probe()
    keys: list[bytes | None] = [b"a", b"b", b"a", None, b"a", b"b", None]
    runner = LaneRunner(probe, concurrency=8, keep_key_order=True, timeout_s=None)
    asyncio.run(runner.run(contexts(keys)))
    of_a = [e for e in probe.events if e[1] in {"m0", "m2", "m4"}]
    assert of_a == [("start", "m0"), ("end", "m0"), ("start", "m2"), ("end", "m2"),
                    ("start", "m4"), ("end", "m4")]
    assert probe.most == 4  # lanes a, b and the two keyless messages at once


def test_a_raising_or_slow_handler_fails_its_message_only() -> None:
    async def handler(ctx: Ctx) -> None:
        if ctx.message_id == "m1":
            raise ValueError("bad")
        if ctx.message_id == "m2":
            await asyncio.sleep(60)

    runner = LaneRunner(handler, concurrency=2, keep_key_order=False, timeout_s=0.05)
    errors = asyncio.run(runner.run(contexts([None] * 4)))
    assert set(errors) == {"m1", "m2"}
    assert isinstance(errors["m1"], ValueError)
    assert isinstance(errors["m2"], TimeoutError)
    assert "handler_timeout_s (0.05 s)" in str(errors["m2"])


def test_a_plain_def_handler_runs_too() -> None:
    seen: list[str] = []
    runner = LaneRunner(lambda ctx: seen.append(ctx.message_id), concurrency=1,
                        keep_key_order=True, timeout_s=None)
    assert asyncio.run(runner.run(contexts([b"k", b"k"]))) == {}
    assert seen == ["m0", "m1"]


def test_cancelling_the_run_cancels_every_handler_and_raises() -> None:
    cancelled: list[str] = []

    async def handler(ctx: Ctx) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(ctx.message_id)
            raise

    async def main() -> None:
        runner = LaneRunner(handler, concurrency=3, keep_key_order=False, timeout_s=None)
        task = asyncio.ensure_future(runner.run(contexts([None] * 5)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sorted(cancelled) == ["m0", "m1", "m2"]  # the three running; none started after


@pytest.mark.parametrize(("concurrency", "timeout_s"), [(0, None), (1, 0.0)])
def test_settings_are_checked(concurrency: int, timeout_s: float | None) -> None:
    with pytest.raises(ConfigError):
        LaneRunner(lambda ctx: None, concurrency=concurrency, keep_key_order=True,
                   timeout_s=timeout_s)
