"""The ASGI order service of examples/asgi_orders.py SIGKILLed under 1,000 concurrent requests.

A client process (tests/fault/workers/orders_client.py) sends 1,000 orders at once; the app
answers each once its message is guaranteed (AsyncGuardedProducer, persist-first). Mid-way
the app is SIGKILLed (dropping the records lingering in librdkafka) and started again on the
same port: it resends the dead instance's outbox records once that instance's lease lapsed,
and answers the requests the client sends again (those that never reached it). A
GuardedConsumer process (consumer_worker.py) handles the topic with a Redis-transactional
effect per message id. Checked: every order answered 2xx is on the topic and handled exactly
once, an order answered with an error (or no answer) at most once, nothing else is handled,
and the restarted app resent some records.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from eoguard.envelope import message_id_for
from eoguard.store.keys import KeySpace
from tests.conftest import free_port
from tests.fault.consumer_fault_kit import Worker, effect_counts, unique_group
from tests.fault.producer_fault_kit import read_topic

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "asgi_orders.py"
ORDERS, CONNECTIONS = 1_000, 100
LEASE_S = 1.5
# Records wait this long in librdkafka after their order was answered (persist-first: in the
# outbox): the SIGKILL drops the latest ones there, and the restarted app's recovery resends.
LINGER_MS = 500


class App:
    """examples/asgi_orders.py in a subprocess, answering on ``port``."""

    def __init__(self, log: Path, *, port: int, bootstrap: str, redis_url: str, topic: str,
                 prefix: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, str(APP), "--bootstrap", bootstrap, "--redis", redis_url,
             "--topic", topic, "--prefix", prefix, "--port", str(port),
             "--lease-s", str(LEASE_S), "--recover-interval-s", "1",
             "--linger-ms", str(LINGER_MS)],
            stdout=self.log, stderr=self.log, cwd=ROOT)
        self.instance = self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the app exited, see {self.log.name}"
            try:
                return str(httpx.get(f"{self.url}/health", timeout=2).json()["instance"])
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"the app did not answer within {timeout_s} s ({self.log.name})")

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL
        self.proc.wait(30)
        self.log.close()

    def stop(self) -> None:
        self.proc.terminate()  # uvicorn shuts down: the lifespan closes the producer
        self.proc.wait(60)
        self.log.close()


def test_app_killed_mid_way_answers_2xx_only_for_orders_handled_exactly_once(
        tmp_path, kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    topic = new_topic(4)
    scope, group = "orders", unique_group("asgi")
    consumer = Worker("consumer_worker.py", kafka_bootstrap, redis_url, topic, key_prefix,
                      scope, group, log=tmp_path / "consumer.log")
    consumer.wait_for("ready")
    port = free_port()
    app_args = {"port": port, "bootstrap": kafka_bootstrap, "redis_url": redis_url,
                "topic": topic, "prefix": key_prefix}
    app = App(tmp_path / "app.log", **app_args)
    first = app.instance
    results_file = tmp_path / "results.json"
    client = Worker("orders_client.py", f"{app.url}/orders", str(ORDERS), str(CONNECTIONS),
                    str(results_file), log=tmp_path / "client.log")

    kill_at = random.randint(150, 450)
    for _ in range(kill_at):
        assert client.wait_for("ok", timeout_s=120) is not None, "the client exited early"
    app.kill()
    app = App(tmp_path / "app.log", **app_args)
    assert client.wait_for("done", timeout_s=240) is not None, "the client exited early"
    client.stop()
    results = json.loads(results_file.read_text())

    answered = {o: r for o, r in results.items() if r["status"] and 200 <= r["status"] < 300}
    failed = {o: r for o, r in results.items() if o not in answered}
    ids = {o: message_id_for("orders", o) for o in results}
    assert all(r["body"]["message_id"] == ids[o] for o, r in answered.items())
    by_instance = {first: 0, app.instance: 0}
    for r in answered.values():
        by_instance[r["body"]["instance"]] += 1

    client_redis = redis.Redis.from_url(redis_url)
    keys = KeySpace(prefix=key_prefix)
    deadline = time.monotonic() + 120
    want = {ids[o] for o in answered}
    while not want <= effect_counts(client_redis, keys, scope)[0]:
        assert time.monotonic() < deadline, "answered orders were not all handled"
        time.sleep(0.5)
    time.sleep(3.0)  # a late duplicate, or a late effect of an unanswered order, shows now
    seen, counts = effect_counts(client_redis, keys, scope)
    app.stop()
    consumer.stop()
    client_redis.close()

    on_topic, resends = read_topic(kafka_bootstrap, topic, expect_ids=want)
    twice = {mid: n for mid, n in counts.items() if n != 1}
    unanswered_handled = {ids[o] for o in failed} & seen
    print(f"\n{ORDERS} orders over {CONNECTIONS} connections; SIGKILL after {kill_at} answers; "
          f"answered 2xx {len(answered)} (first instance {by_instance[first]}, restarted "
          f"{by_instance[app.instance]}), errors {len(failed)} (of which handled "
          f"{len(unanswered_handled)}); handled {len(seen)}, counters not 1: {len(twice)}; "
          f"records on the topic {sum(on_topic.values())}, resent by recovery "
          f"{sum(resends.values())}")
    assert len(results) == ORDERS
    assert by_instance[first] >= kill_at  # killed mid-way: both instances answered
    assert by_instance[app.instance] > 0
    assert sum(resends.values()) > 0  # the restarted app recovered its predecessor's outbox
    assert want <= on_topic.keys()
    assert want <= seen  # every 2xx order handled ...
    assert not twice  # ... and no order handled twice (2xx or not)
    assert seen <= set(ids.values())  # nothing handled that was not ordered
