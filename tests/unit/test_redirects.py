"""eoguard.store.redirects without a server: what each result of a cluster round trip asks for.

The redirects themselves run against a real cluster: tests/integration/test_reshard_store.py
(ASK to a master the client does not know, ASK under replicated durability) and
tests/integration/test_slot_migration.py (ASK, TRYAGAIN, MOVED while a slot moves).
"""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    TryAgainError,
)

from eoguard.errors import StoreError, StoreUnavailableError
from eoguard.store.redirects import (
    SENT_AGAIN,
    ClusterStack,
    Step,
    step_of,
    store_error,
    tryagain_pause_s,
)


@pytest.mark.parametrize(("result", "step"), [
    (b"OK", Step.ANSWERED),
    ([b"?", b"k"], Step.ANSWERED),  # the undeclared-keys answer is a reply: Scripts.answer_asks
    (None, Step.ANSWERED),
    (MovedError("3999 127.0.0.1:7002"), Step.MOVED),  # a subclass of AskError in redis-py
    (AskError("3999 127.0.0.1:7006"), Step.ASK),
    (TryAgainError("Multiple keys request during rehashing of slot"), Step.TRYAGAIN),
    (NoScriptError("No matching script."), Step.NOSCRIPT),
    (redis.ConnectionError("Connection reset by peer"), Step.UNAVAILABLE),
    (redis.TimeoutError("Timeout reading from socket"), Step.UNAVAILABLE),
    (ClusterDownError("The cluster is down"), Step.UNAVAILABLE),
    (redis.ResponseError("Error running script: @user_script:1: oops"), Step.FAILED),
])
def test_each_result_asks_for_one_step(result: object, step: Step) -> None:
    assert step_of(result) is step


def test_only_redirects_and_noscript_send_a_call_again() -> None:
    assert {Step.ASK, Step.MOVED, Step.TRYAGAIN, Step.NOSCRIPT} == SENT_AGAIN


def test_an_ask_names_the_master_to_run_the_call_on() -> None:
    ask = AskError("3999 127.0.0.1:7006")
    assert (ask.host, ask.port, ask.slot_id) == ("127.0.0.1", 7006, 3999)


def test_the_pause_after_tryagain_grows_a_little_and_stays_short() -> None:
    pauses = [tryagain_pause_s(n) for n in range(16)]
    assert pauses[0] == pytest.approx(0.05)
    assert pauses == sorted(pauses)
    assert max(pauses) == pytest.approx(0.1)
    assert sum(pauses[:-1]) < 1.5  # the passes of one round trip pause ~1.2 s at most


@pytest.mark.parametrize(("exc", "kind"), [
    (ClusterDownError("The cluster is down"), StoreUnavailableError),
    (redis.ConnectionError("refused"), StoreUnavailableError),
    (redis.ResponseError("Error running script"), StoreError),
])
def test_a_call_error_is_a_store_error(exc: Exception, kind: type[StoreError]) -> None:
    error = store_error(exc, "marking a batch done")
    assert type(error) is kind
    assert "marking a batch done" in str(error)


def test_a_cluster_stack_keeps_the_commands_in_order_with_their_options() -> None:
    stack = ClusterStack()
    stack.execute_command("EVALSHA", "abc", 1, "k", "v", target_nodes="node")
    stack.execute_command("WAIT", 1, 500)
    assert [(c.args, c.options, c.position) for c in stack.commands] == [
        (("EVALSHA", "abc", 1, "k", "v"), {"target_nodes": "node"}, 0),
        (("WAIT", 1, 500), {}, 1)]
