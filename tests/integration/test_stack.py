"""The local stack: jar sets, idempotent start, readiness, crash and restart keeping data."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pyspark
import pytest
import redis
import tomllib
from confluent_kafka import Consumer, Producer

from eoguard.errors import StackError
from eoguard.stack import LocalStack, resolve
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _pom_property(kind: str, name: str) -> str:
    text = (ROOT / "compose" / "maven" / kind / "pom.xml").read_text()
    found = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", text)
    assert found, f"{name} missing from the {kind} POM"
    return found.group(1)


def test_spark_connector_version_matches_the_pyspark_pin() -> None:
    pyproject = tomllib.loads((ROOT / "connectors" / "spark" / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("pyspark"))
    assert pin == f"pyspark=={_pom_property('spark', 'spark.version')}"
    assert importlib.metadata.version("pyspark") == _pom_property("spark", "spark.version")


def test_spark_jar_set_holds_only_what_pyspark_lacks() -> None:
    names = sorted(p.name for p in resolve("spark"))
    spark = _pom_property("spark", "spark.version")
    assert names == sorted([
        f"commons-pool2-{_pom_property('spark', 'commons-pool2.version')}.jar",
        f"kafka-clients-{_pom_property('spark', 'kafka-clients.version')}.jar",
        f"spark-avro_2.13-{spark}.jar",
        f"spark-sql-kafka-0-10_2.13-{spark}.jar",
        f"spark-token-provider-kafka-0-10_2.13-{spark}.jar",
    ])
    pyspark_jars = (Path(pyspark.__file__).parent / "jars").glob("*.jar")
    shipped = {re.sub(r"-[0-9][^-]*\.jar$", "", p.name) for p in pyspark_jars}
    ours = {re.sub(r"-[0-9][^-]*\.jar$", "", n) for n in names}
    assert not ours & shipped, f"second copies on the classpath: {ours & shipped}"


def test_kafka_jar_set_runs_a_kraft_broker() -> None:
    names = {p.name for p in resolve("kafka")}
    assert any(n.startswith("kafka_2.13-") for n in names)
    assert any(n.startswith("log4j-slf4j2-impl-") for n in names)


def test_up_is_idempotent_and_services_answer(stack, local_stack: LocalStack) -> None:
    ends, started = local_stack.up()
    assert started == []
    assert ends == stack
    assert redis.Redis.from_url(ends.redis_url).ping()
    status = local_stack.status()
    if ends.kafka_managed:
        assert status["kafka"]["ready"] is True
        assert status["kafka"]["pid"]


def test_environment_names_existing_services(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EOGUARD_KAFKA_BOOTSTRAP", "kafka.example:9092")
    monkeypatch.setenv("EOGUARD_REDIS_URL", "redis://cache.example:6379/2")
    ends = LocalStack(tmp_path).endpoints()
    assert (ends.kafka_bootstrap, ends.redis_url) == ("kafka.example:9092", "redis://cache.example:6379/2")
    assert not ends.kafka_managed
    assert not ends.redis_managed


def test_redis_keeps_acknowledged_writes_across_sigkill(private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.address)
    for i in range(500):
        client.set(f"k{i}", i)
    private_redis.kill()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert private_redis.start() is True
    client = redis.Redis.from_url(private_redis.address)
    assert client.dbsize() == 500
    assert client.get("k499") == b"499"


def test_kafka_keeps_its_log_across_sigkill(private_kafka: KafkaBroker) -> None:
    producer = Producer({"bootstrap.servers": private_kafka.address, "acks": "all"})
    for i in range(100):
        producer.produce("restart", str(i).encode())
    assert producer.flush(30) == 0
    private_kafka.kill()
    assert private_kafka.start() is True
    consumer = Consumer({"bootstrap.servers": private_kafka.address, "group.id": "g",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["restart"])
    seen: list[bytes] = []
    for _ in range(60):
        seen += [m.value() for m in consumer.consume(100, timeout=1) if m.error() is None]
        if len(seen) >= 100:
            break
    consumer.close()
    assert sorted(int(v) for v in seen) == list(range(100))


def test_a_service_that_cannot_start_names_its_log(tmp_path: Path, stack) -> None:
    taken = int(stack.redis_url.rsplit(":", 1)[1].split("/")[0]) if stack.redis_managed else None
    if taken is None:
        pytest.skip("needs the stack's own Redis port to collide with; EOGUARD_REDIS_URL names another")
    server = RedisServer(tmp_path / "clash", port=taken)
    server.workdir.mkdir(parents=True)
    # The port is taken, so this Redis exits at once; start must say so and point at the log.
    server.is_ready = lambda: False  # type: ignore[method-assign]
    with pytest.raises(StackError, match=re.escape(str(server.log_path))):
        server.start()
