"""compose/docker-compose.yml and the Spark job's image, checked statically (no Docker engine
here): Kafka reachable from the host and from the compose network, the topics and the dedup
keys both kept in volumes, and every image and jar at the version the process stack pins
(compose/maven/*/pom.xml, connectors/spark/pyproject.toml, eoguard.stack's settings)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "spark" / "Dockerfile"
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
LOOPBACK = {"127.0.0.1", "localhost"}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def pom(kind: str) -> tuple[dict[str, str], list[str]]:
    """A stack POM's properties and its dependencies' artifactIds."""
    tree = ET.parse(ROOT / "compose" / "maven" / kind / "pom.xml")
    props = {el.tag.split("}")[1]: el.text or ""
             for el in tree.findall("m:properties/*", POM_NS)}
    artifacts = [el.text or "" for el in tree.findall("m:dependencies/m:dependency/m:artifactId",
                                                       POM_NS)]
    return props, artifacts


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` as {name: (host, port)}."""
    out = {}
    for item in value.split(","):
        name, _, rest = item.partition("://")
        host, _, port = rest.rpartition(":")
        out[name] = (host, int(port))
    return out


def published(service: dict[str, Any]) -> set[int]:
    """The container ports a service publishes on the host."""
    return {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}


def image_tag(service: dict[str, Any]) -> str:
    return str(service["image"]).rsplit(":", 1)[1]


def kafka_problems(spec: dict[str, Any]) -> list[str]:
    """What keeps the host or a container on the compose network from reaching Kafka."""
    kafka = spec["services"]["kafka"]
    env = kafka["environment"]
    bound = listeners(env["KAFKA_LISTENERS"])
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    problems = [f"{name} advertised but not bound on port {port}"
                for name, (_, port) in advertised.items() if bound.get(name, ("", -1))[1] != port]
    problems += [f"{name} has no security protocol" for name in bound if name not in protocols]
    host_side = [n for n, (host, port) in advertised.items()
                 if host in LOOPBACK and port in published(kafka)]
    network_side = [n for n, (host, _) in advertised.items()
                    if host in {"kafka", kafka.get("hostname")}]
    if not host_side:
        problems.append("no listener advertised on loopback at a published port (the host's)")
    if not network_side:
        problems.append("no listener advertised as the service name (the compose network's)")
    if env.get("KAFKA_INTER_BROKER_LISTENER_NAME") not in advertised:
        problems.append("the inter-broker listener is not one of the advertised ones")
    return problems


def test_kafka_is_reachable_from_the_host_and_from_the_compose_network() -> None:
    assert kafka_problems(compose()) == []


def test_the_listener_check_can_fail() -> None:
    spec = compose()
    env = spec["services"]["kafka"]["environment"]
    env["KAFKA_ADVERTISED_LISTENERS"] = "HOST://127.0.0.1:9092"  # the file as it was
    env["KAFKA_INTER_BROKER_LISTENER_NAME"] = "HOST"
    assert kafka_problems(spec) == [
        "no listener advertised as the service name (the compose network's)"]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """{container path: named volume} of a service."""
    return {target: source for source, target, *_ in
            (str(v).split(":") for v in service.get("volumes", []))}


def test_kafka_and_redis_keep_their_data_in_named_volumes() -> None:
    spec = compose()
    kafka, redis = spec["services"]["kafka"], spec["services"]["redis"]
    declared = set(spec.get("volumes") or {})
    log_dirs = kafka["environment"]["KAFKA_LOG_DIRS"]
    assert mounts(kafka).get(log_dirs) in declared
    assert mounts(redis).get("/data") in declared
    assert mounts(kafka)[log_dirs] != mounts(redis)["/data"]
    # a formatted log dir is kept only under the cluster id it was formatted with
    assert kafka["environment"].get("CLUSTER_ID")


def test_images_are_the_versions_the_stack_pins() -> None:
    services = compose()["services"]
    assert image_tag(services["kafka"]) == pom("kafka")[0]["kafka.version"]
    assert image_tag(services["schema-registry"]) == pom("registry")[0]["apicurio.version"]
    for name in ("spark-master", "spark-worker"):
        build = services[name]["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def spark_pin() -> str:
    deps = tomllib.loads((ROOT / "connectors" / "spark" / "pyproject.toml").read_text())
    (pin,) = [d for d in deps["project"]["dependencies"] if d.startswith("pyspark")]
    return pin.removeprefix("pyspark==")


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))


def test_the_job_image_is_spark_at_the_pyspark_pin_with_the_stacks_jars() -> None:
    text = DOCKERFILE.read_text()
    props, artifacts = pom("spark")
    args = dockerfile_args()
    assert re.search(rf"^FROM apache/spark:{re.escape(spark_pin())}$", text, re.M)
    assert props["spark.version"] == spark_pin() == args["SPARK_VERSION"]
    assert args["KAFKA_CLIENTS_VERSION"] == props["kafka-clients.version"]
    assert args["COMMONS_POOL2_VERSION"] == props["commons-pool2.version"]
    added = re.findall(r"^ADD .*/([\w.-]+)/\$\{\w+\}/[\w.${}-]+\.jar /opt/spark/jars/$", text, re.M)
    assert sorted(added) == sorted(artifacts)


def test_the_job_image_installs_what_the_job_needs() -> None:
    text = DOCKERFILE.read_text()
    deps = tomllib.loads((ROOT / "connectors" / "spark" / "pyproject.toml").read_text())
    wanted = [d for d in deps["project"]["dependencies"]
              if not d.startswith(("pyspark", "eoguard"))]  # the image's Spark; eoguard below
    assert wanted
    assert all(f'"{d}"' in text for d in wanted)
    assert "pip install --no-cache-dir /src/eoguard " in text  # with redis among its deps
    assert "--no-deps /src/eoguard-spark" in text


def test_redis_persists_as_the_stack_configures_it(tmp_path: Path) -> None:
    RedisServer(tmp_path).prepare()
    stack = set((tmp_path / "redis.conf").read_text().splitlines())
    command = compose()["services"]["redis"]["command"]
    given = {f"{k.lstrip('-')} {v or chr(39) * 2}" for k, v in zip(command[1::2], command[2::2],
                                                                   strict=True)}
    for line in ("appendonly yes", "appendfsync always", "save ''"):
        assert line in stack
        assert line in given


@pytest.mark.parametrize("setting", ["num.partitions", "group.initial.rebalance.delay.ms",
                                     "offsets.topic.replication.factor",
                                     "transaction.state.log.replication.factor",
                                     "transaction.state.log.min.isr"])
def test_kafka_settings_are_the_single_nodes(setting: str, tmp_path: Path) -> None:
    lines = KafkaBroker(tmp_path)._properties().splitlines()
    stack = dict(line.split("=", 1) for line in lines if "=" in line)
    env = compose()["services"]["kafka"]["environment"]
    assert str(env["KAFKA_" + setting.upper().replace(".", "_")]) == stack[setting]
