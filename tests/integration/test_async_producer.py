"""AsyncGuardedProducer against the real Kafka and Redis, each test on an event loop in debug
mode that fails when any step blocked the loop over 100 ms (tests/async_kit.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from eoguard.config import SchemaRegistryConfig
from eoguard.errors import (
    BackpressureError,
    BrokerError,
    InvalidMessageError,
    PersistError,
    ProducerClosedError,
    RegistryUnavailableError,
)
from eoguard.modes import WireFormat
from eoguard.producer.aio import AsyncGuardedProducer
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox, RecordState
from tests.async_kit import Ticker, run
from tests.conftest import free_port
from tests.consumer_kit import headers_of, read_all
from tests.integration.test_header_format import an_order
from tests.integration.test_producer import consume, make_config
from tests.schema_versions import ORDER

pytestmark = pytest.mark.integration

MODES = ["persist-first", "delayed"]


class Calls:
    """What the callbacks saw: ids per kind, and the thread each ran on."""

    def __init__(self) -> None:
        self.guaranteed: list[str] = []
        self.failed: list[tuple[str, Exception]] = []
        self.threads: set[int] = set()

    def on_guaranteed(self, handle) -> None:
        self.threads.add(threading.get_ident())
        self.guaranteed.append(handle.id)

    async def on_guaranteed_async(self, handle) -> None:
        await asyncio.sleep(0)
        self.on_guaranteed(handle)

    def on_failed(self, handle, error) -> None:
        self.threads.add(threading.get_ident())
        self.failed.append((handle.id, error))


async def until(check, timeout_s: float = 30.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout_s)


async def send_all(producer: AsyncGuardedProducer, topic: str, n: int,
                   chunk: int = 25) -> list[asyncio.Future[str]]:
    """send_nowait ``n`` messages, ``chunk`` per loop step: in debug mode each future records
    where it was created (a traceback), so hundreds in one step would hold the loop."""
    futures = []
    for start in range(0, n, chunk):
        futures += [producer.send_nowait(topic, b"m%d" % i)
                    for i in range(start, min(start + chunk, n))]
        await asyncio.sleep(0)
    return futures


@pytest.mark.parametrize("mode", MODES)
def test_send_returns_the_id_once_the_message_is_guaranteed(
        mode, kafka_bootstrap, redis_url, redis_client, key_prefix, new_topic) -> None:
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix, mode=mode)
    calls = Calls()

    async def main() -> tuple[list[str], int]:
        async with AsyncGuardedProducer(config, on_guaranteed=calls.on_guaranteed) as producer:
            ids = []
            for i in range(20):
                ids.append(await producer.send(topic, b"v%d" % i))
                assert ids[-1] in calls.guaranteed  # its callback ran before send returned
            ids += await asyncio.gather(*(producer.send(topic, b"c%d" % i) for i in range(50)))
            return ids, producer.stats().guaranteed

    ids, guaranteed = run(main())
    assert len(set(ids)) == 70
    assert guaranteed == 70
    assert calls.threads == {threading.get_ident()}  # callbacks ran on the loop's thread
    if mode == "persist-first":
        outbox = Outbox(redis_client, config.keyspace)
        assert {outbox.get(i).state for i in ids[:20]} <= {  # type: ignore[union-attr]
            RecordState.PENDING, RecordState.PUBLISHED}
    assert {env.id for _, env in consume(kafka_bootstrap, topic, 70)} == set(ids)


def test_send_nowait_returns_a_future_at_once(kafka_bootstrap, redis_url, key_prefix,
                                              new_topic) -> None:
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix)

    async def main() -> list[str]:
        async with AsyncGuardedProducer(config) as producer:
            futures = [producer.send_nowait(topic, b"n%d" % i) for i in range(20)]
            assert not any(f.done() for f in futures)  # nothing settles before the loop turns
            futures += await send_all(producer, topic, 280)
            return list(await asyncio.gather(*futures))

    ids = run(main())
    assert len(set(ids)) == 300
    assert {env.id for _, env in consume(kafka_bootstrap, topic, 300)} == set(ids)


def test_a_cancelled_send_leaves_its_message_guaranteed_and_its_callbacks_fired(
        kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix)
    plain, awaited = Calls(), Calls()

    async def main() -> tuple[set[str], int]:
        async with AsyncGuardedProducer(config) as producer:
            tasks = [asyncio.create_task(producer.send(
                topic, b"x%d" % i,
                on_guaranteed=plain.on_guaranteed if i % 2 else awaited.on_guaranteed_async))
                for i in range(50)]
            await asyncio.sleep(0)  # each task ran its first step: its message is sent
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            assert await producer.flush(30) == 0
            await until(lambda: len(plain.guaranteed) + len(awaited.guaranteed) == 50)
            return set(plain.guaranteed + awaited.guaranteed), producer.stats().guaranteed

    ids, guaranteed = run(main())
    assert len(ids) == 50
    assert guaranteed == 50
    assert {env.id for _, env in consume(kafka_bootstrap, topic, 50)} == ids


@pytest.mark.parametrize("mode", MODES)
def test_close_from_the_loop_flushes_without_blocking_it(mode, kafka_bootstrap, redis_url,
                                                         key_prefix, new_topic) -> None:
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix, mode=mode)
    calls = Calls()

    async def main() -> tuple[list[asyncio.Future[str]], int]:
        producer = AsyncGuardedProducer(config, on_guaranteed=calls.on_guaranteed_async)
        await producer.start()
        futures = await send_all(producer, topic, 500)
        ticker = Ticker()
        await producer.close()
        ticks = await ticker.stop()
        with pytest.raises(ProducerClosedError):
            await producer.send(topic, b"late")
        return futures, ticks

    futures, ticks = run(main())
    ids = [f.result() for f in futures]  # every future resolved, none failed
    assert sorted(calls.guaranteed) == sorted(ids)  # every async callback ran before close returned
    assert ticks > 0  # the loop kept turning while close flushed
    assert {env.id for _, env in consume(kafka_bootstrap, topic, 500)} == set(ids)


def test_callbacks_may_be_async_and_a_raising_one_changes_nothing(
        kafka_bootstrap, redis_url, key_prefix, new_topic, caplog) -> None:
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix)

    def raising(handle) -> None:
        raise RuntimeError("application bug")

    async def raising_async(handle) -> None:
        raise RuntimeError("async application bug")

    async def main() -> int:
        async with AsyncGuardedProducer(config, on_guaranteed=raising_async) as producer:
            await producer.send(topic, b"a")
            await producer.send(topic, b"b", on_guaranteed=raising)
            await until(lambda: producer.callback_errors == 2)
            return producer.stats().guaranteed

    assert run(main()) == 2
    assert "async application bug" in caplog.text
    assert "application bug" in caplog.text


def test_bad_input_raises_at_once_and_state_is_checked(kafka_bootstrap, redis_url, key_prefix,
                                                       new_topic) -> None:
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix)

    async def main() -> None:
        producer = AsyncGuardedProducer(config)
        with pytest.raises(ProducerClosedError, match="before start"):
            producer.send_nowait(topic, b"x")
        async with producer:
            with pytest.raises(InvalidMessageError):
                await producer.send("", b"x")
            with pytest.raises(InvalidMessageError):
                producer.send_nowait(topic, "not bytes")
            assert producer.stats().sent == 0
        with pytest.raises(ProducerClosedError, match="after close"):
            await producer.send(topic, b"x")

    run(main())


def test_a_record_kafka_refuses_raises_broker_error(kafka_bootstrap, redis_url,
                                                    key_prefix) -> None:
    """delayed: a record Kafka refuses for good fails (BrokerError, as on_failed gets it)."""
    config = make_config(kafka_bootstrap, redis_url, key_prefix, mode="delayed",
                         delay_min_ms=2_000, delay_max_ms=5_000)
    calls = Calls()

    async def main() -> None:
        async with AsyncGuardedProducer(config, on_failed=calls.on_failed) as producer:
            with pytest.raises(BrokerError, match="Invalid topic"):
                await producer.send("not a valid topic!", b"x")

    run(main())
    assert len(calls.failed) == 1
    assert isinstance(calls.failed[0][1], BrokerError)


def test_persist_first_with_redis_down_raises_persist_error(
        private_redis, kafka_bootstrap, key_prefix, new_topic) -> None:
    """The queue fills while the outbox is unreachable; the next send waits send_timeout_s
    off the loop, then raises PersistError; the queued messages are guaranteed once Redis is
    back."""
    topic = new_topic()
    config = make_config(kafka_bootstrap, private_redis.address, key_prefix,
                         max_queue_messages=20, send_timeout_s=0.5)

    async def main() -> tuple[list[str], int]:
        async with AsyncGuardedProducer(config) as producer:
            await producer.send(topic, b"before")
            await asyncio.to_thread(private_redis.kill)
            queued = [producer.send_nowait(topic, b"during") for _ in range(20)]
            ticker = Ticker()
            with pytest.raises(PersistError):
                await producer.send(topic, b"during")  # full past send_timeout_s
            assert await ticker.stop() > 0  # the loop turned while send waited
            with pytest.raises(PersistError):
                producer.send_nowait(topic, b"during")  # full: at once
            assert not any(f.done() for f in queued)
            await asyncio.to_thread(private_redis.start)
            ids = list(await asyncio.wait_for(asyncio.gather(*queued), 60))
            return ids, producer.stats().failed

    ids, failed = run(main())
    assert len(set(ids)) == 20
    assert failed == 0


def test_kafka_unreachable_raises_backpressure_error(redis_url, key_prefix) -> None:
    """No broker at all: librdkafka's queue fills, then eoguard's; send_nowait raises
    BackpressureError at once, send after waiting send_timeout_s off the loop."""
    nowhere = f"127.0.0.1:{free_port()}"
    kafka = {"queue.buffering.max.messages": 5, "message.timeout.ms": 60_000}
    config = make_config(nowhere, redis_url, key_prefix, kafka=kafka, max_queue_messages=10,
                         send_timeout_s=0.3)

    async def main() -> int:
        async with AsyncGuardedProducer(config) as producer:
            accepted: list[asyncio.Future[str]] = []
            with pytest.raises(BackpressureError):
                fill_at_once(producer, accepted)
            ticker = Ticker()
            ids: list[str] = []
            with pytest.raises(BackpressureError):  # once no room came free in send_timeout_s
                await fill_waiting(producer, ids)
            assert await ticker.stop() > 0
            ids += await asyncio.wait_for(asyncio.gather(*accepted), 30)  # through Redis
            await producer.close(0.5)
            return len(ids)

    assert 5 <= run(main()) <= 20


def fill_at_once(producer: AsyncGuardedProducer, accepted: list[asyncio.Future[str]]) -> None:
    """send_nowait until it raises."""
    for _ in range(100):
        accepted.append(producer.send_nowait("t", b"x"))
    raise AssertionError("send_nowait never refused a message")


async def fill_waiting(producer: AsyncGuardedProducer, ids: list[str]) -> None:
    """send (each guaranteed through Redis) until one raises."""
    for _ in range(100):
        ids.append(await producer.send("t", b"x"))
    raise AssertionError("send never refused a message")


def test_header_format_asks_the_registry_off_the_loop(kafka_bootstrap, redis_url, key_prefix,
                                                       new_topic, schema_registry_url) -> None:
    """A schema's first send to a topic asks Schema Registry for its id on a worker thread
    (send_nowait returns send's task); later sends find it cached. An unreachable registry
    raises RegistryUnavailableError, as the sync send does."""
    topic = new_topic()
    config = make_config(kafka_bootstrap, redis_url, key_prefix, wire_format=WireFormat.HEADERS,
                         schema_registry=SchemaRegistryConfig(url=schema_registry_url))
    nowhere = make_config(kafka_bootstrap, redis_url, key_prefix, wire_format=WireFormat.HEADERS,
                          schema_registry=SchemaRegistryConfig(
                              url=f"http://127.0.0.1:{free_port()}"))

    async def main() -> list[str]:
        async with AsyncGuardedProducer(config) as producer:
            first = producer.send_nowait(topic, an_order(0), schema=ORDER)
            assert isinstance(first, asyncio.Task)  # the registry call is due
            ids = [await first]
            later = producer.send_nowait(topic, an_order(1), schema=ORDER)
            assert not isinstance(later, asyncio.Task)  # the id is cached
            ids.append(await later)
            ids.append(await producer.send(new_topic(), an_order(2), schema=ORDER))
        async with AsyncGuardedProducer(nowhere) as producer:
            with pytest.raises(RegistryUnavailableError):
                await producer.send(topic, an_order(3), schema=ORDER)
        return ids

    ids = run(main())
    assert len(set(ids)) == 3
    assert {headers_of(m)["ce_id"] for m in read_all(kafka_bootstrap, topic, 2)} == set(ids[:2])


def test_a_cancelled_start_closes_the_producer_its_thread_goes_on_building(
        kafka_bootstrap, private_redis, key_prefix) -> None:
    """Redis is stopped (SIGSTOP) while start() connects; the start is cancelled, then Redis
    continues: the thread finishes building the producer, which is then closed (its liveness
    lease dropped), not left running with nobody to close it."""
    config = make_config(kafka_bootstrap, private_redis.address, key_prefix)
    pid = private_redis.pid()

    async def main() -> None:
        producer = AsyncGuardedProducer(config)
        os.kill(pid, signal.SIGSTOP)
        try:
            starting = asyncio.create_task(producer.start())
            await asyncio.sleep(0.3)  # the worker thread is connecting, held by Redis
            assert not starting.done()
            starting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await starting
        finally:
            os.kill(pid, signal.SIGCONT)
        with pytest.raises(ProducerClosedError):
            await producer.send("t", b"x")

    run(main())  # its executor's shutdown waits for the building thread
    client = private_redis.client(timeout_s=5.0)
    live = Liveness(client, config.keyspace)
    deadline = time.monotonic() + 30
    while live.live_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"producers holding a liveness lease after the cancelled start: {live.live_count()}")
    assert live.live_count() == 0, "the producer the cancelled start built was never closed"
