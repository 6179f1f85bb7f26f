"""examples/spark_orders.py run as a user runs it (its ``main`` with command-line arguments),
in the session of the Spark tests, over what examples/orders_producer.py sent."""

from __future__ import annotations

import importlib

import pytest

from tests.integration.test_examples import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_the_spark_example_writes_each_order_once(spark, new_topic, kafka_bootstrap, redis_url,
                                                  key_prefix, tmp_path, monkeypatch,
                                                  capsys) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    producer = importlib.import_module("orders_producer")
    job = importlib.import_module("spark_orders")
    topic = new_topic(2)
    args = ["--bootstrap", kafka_bootstrap, "--redis", redis_url, "--prefix", key_prefix,
            "--topic", topic]
    assert producer.main([*args, "--count", "20"]) == 0
    assert job.main([*args, "--out", str(tmp_path / "job")], spark=spark) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"20 orders in {tmp_path / 'job' / 'output'}, 20 distinct"
