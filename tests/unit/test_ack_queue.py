"""AckQueue (eoguard_spark.acks): the Spark job's background acknowledgement passes, one at a
time, in order, each error raised once (pure logic: the passes here are plain functions)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FuturesTimeout

import pytest

from eoguard_spark.acks import AckQueue


def test_each_pass_waits_for_the_one_before() -> None:
    queue = AckQueue("q-order")
    release = threading.Event()
    ran: list[str] = []

    def first() -> int:
        release.wait(5)
        ran.append("first")
        return 3

    queue.submit(0, first)
    submitted = threading.Event()

    def submit_second() -> None:
        queue.submit(1, lambda: ran.append("second") or 2)
        submitted.set()

    thread = threading.Thread(target=submit_second)
    thread.start()
    time.sleep(0.2)
    blocked = not submitted.is_set()  # the second submit waits for the first pass
    release.set()
    thread.join(5)
    acked = queue.wait(5)
    print(f"second submit blocked while the first ran: {blocked}; order={ran}; acked={acked}")
    assert blocked
    assert ran == ["first", "second"]
    assert acked == 2
    assert queue.wait() is None  # nothing in flight any more
    queue.close()


def test_a_failed_pass_is_raised_by_the_next_submit_once() -> None:
    queue = AckQueue("q-fail")

    def broken() -> int:
        raise RuntimeError("redis down")

    queue.submit(4, broken)
    ran: list[int] = []
    with pytest.raises(RuntimeError, match="redis down"):
        queue.submit(5, lambda: ran.append(5) or 1)
    assert ran == []  # batch 5's pass did not start: its batch failed instead
    assert queue.wait() is None  # raised once
    queue.submit(6, lambda: 7)
    assert queue.wait(5) == 7
    queue.close()


def test_a_timed_out_wait_leaves_the_pass_in_flight() -> None:
    queue = AckQueue("q-slow")
    release = threading.Event()
    queue.submit(0, lambda: release.wait(5) and 9)
    with pytest.raises(FuturesTimeout):
        queue.wait(0.05)
    release.set()
    assert queue.wait(5) == 9  # the same pass, waited on again
    queue.close()


def test_a_queue_started_again_under_the_same_query_closes_the_old_one() -> None:
    old = AckQueue("q-same")
    release = threading.Event()
    done: list[str] = []
    old.submit(0, lambda: (release.wait(5), done.append("old"))[0] and 1)
    release.set()
    AckQueue("q-same").close()  # waits for the old queue's pass first
    assert done == ["old"]
