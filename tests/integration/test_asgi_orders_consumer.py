"""The order service of examples/asgi_orders.py and its consumer side,
examples/asgi_orders_consumer.py (an AsyncGuardedConsumer), each in a process of its own:
every order answered 201 is charged exactly once, and SIGTERM stops the consumer cleanly."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from eoguard.envelope import message_id_for
from eoguard.store.keys import KeySpace
from tests.conftest import free_port
from tests.fault.consumer_fault_kit import Worker
from tests.fault.test_asgi_orders_crash import App

pytestmark = pytest.mark.integration

CONSUMER = Path(__file__).resolve().parents[2] / "examples" / "asgi_orders_consumer.py"
ORDERS, SCOPE = 60, "billing"


def test_every_order_answered_201_is_charged_once_by_the_async_consumer(
        tmp_path, kafka_bootstrap, redis_url, redis_client, key_prefix, new_topic) -> None:
    topic = new_topic(2)
    app = App(tmp_path / "app.log", port=free_port(), bootstrap=kafka_bootstrap,
              redis_url=redis_url, topic=topic, prefix=key_prefix)
    consumer = Worker(str(CONSUMER), "--bootstrap", kafka_bootstrap, "--redis", redis_url,
                      "--topic", topic, "--group", f"billing-{key_prefix}", "--scope", SCOPE,
                      "--prefix", key_prefix, "--concurrency", "8", "--charge-ms", "2",
                      log=tmp_path / "consumer.log")
    try:
        assert consumer.wait_for("ready") is not None
        with httpx.Client(base_url=app.url, timeout=10) as client:
            answers = [client.post("/orders", json={"order_id": f"o-{i}", "amount": f"{i}.50"})
                       for i in range(ORDERS)]
        assert [a.status_code for a in answers] == [201] * ORDERS
        charged = []
        for _ in range(ORDERS):
            line = consumer.wait_for("charged ", timeout_s=30)
            assert line is not None, "the consumer exited (see consumer.log)"
            charged.append(line.removeprefix("charged "))
        consumer.proc.terminate()  # run() cancelled: the batch in flight finished, then closed
        assert consumer.wait_for("stopped", timeout_s=30) is not None
        assert consumer.proc.wait(30) == 0
        consumer.stop()
    finally:
        if consumer.proc.poll() is None:
            consumer.kill()
        app.stop()
    assert sorted(charged) == sorted(f"o-{i}" for i in range(ORDERS))  # each once
    keys = KeySpace(prefix=key_prefix)
    for i in range(ORDERS):
        mid = message_id_for("orders", f"o-{i}")
        assert redis_client.get(keys.effect(SCOPE, mid, f"charges:{mid}")) == b"1"
        assert redis_client.hget(keys.effect(SCOPE, mid, f"charged:{mid}"), "order_id") == b"o-%d" % i
