"""Session fixtures: the real local stack (Kafka, Redis, Schema Registry), started once and
stopped at the end.

With ``--docker`` the stack comes from ``compose/docker-compose.yml`` through pytest-docker;
otherwise from :mod:`eoguard.stack` (the process stack CI uses). ``EOGUARD_KAFKA_BOOTSTRAP`` /
``EOGUARD_REDIS_URL`` / ``EOGUARD_SCHEMA_REGISTRY_URL`` point the tests at services that
already run.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from eoguard.config import SchemaRegistryConfig
from eoguard.errors import StackError
from eoguard.stack import Endpoints, LocalStack, create_topics, spark_jars
from eoguard.stack.kafka_broker import KafkaBroker, broker_answers
from eoguard.stack.redis_server import RedisServer
from eoguard.stack.schema_registry import CCOMPAT_PATH, registry_answers
from eoguard.store.client import connect
from tests.redis_kit import acl_user

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--docker", action="store_true",
                     help="run Kafka and Redis from compose/docker-compose.yml via pytest-docker")
    parser.addoption("--topology", choices=["single", "all"], default="all",
                     help="single: run tests marked cluster on the single-node stack only "
                          "(make test-fast); all (default): on the cluster topology too")


@pytest.fixture(scope="session")
def local_stack() -> LocalStack:
    """The process stack object (also used by fault tests to kill and restart services)."""
    return LocalStack()


@pytest.fixture(scope="session")
def single_stack(request: pytest.FixtureRequest, local_stack: LocalStack) -> Iterator[Endpoints]:
    """Endpoints of a running Kafka and Redis; fails loudly when they cannot be started."""
    if request.config.getoption("--docker"):
        yield request.getfixturevalue("docker_stack")
        return
    ends, started = local_stack.up()
    yield ends
    _down_or_keep(local_stack, started)


@pytest.fixture(scope="session")
def cluster_stack() -> Iterator[Endpoints]:
    """The cluster topology (three Kafka nodes, a Redis Cluster of 3 masters + 3 replicas),
    started on first use (~30 s) and stopped at the end; EOGUARD_CLUSTER_KAFKA_BOOTSTRAP /
    EOGUARD_CLUSTER_REDIS_URL name running ones instead."""
    cluster = LocalStack(topology="cluster")
    ends, started = cluster.up()
    yield ends
    _down_or_keep(cluster, started)


def _down_or_keep(stack: LocalStack, started: list[str]) -> None:
    """Stop what the session started, or with EOGUARD_KEEP_STACK leave it running (detached:
    its processes are no children this session forgets while they run)."""
    if os.environ.get("EOGUARD_KEEP_STACK"):
        stack.keep(started)
    elif started:
        stack.down(started)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``cluster`` runs twice: on the single-node stack and on the cluster
    (``cluster(only=True)``: on the cluster alone)."""
    marker = metafunc.definition.get_closest_marker("cluster")
    if marker is None:
        return
    cluster: object = "cluster"
    if metafunc.config.getoption("--topology") == "single":
        cluster = pytest.param("cluster", marks=pytest.mark.skip(
            reason="--topology single: this run starts no cluster topology"))
    params = [cluster] if marker.kwargs.get("only") else ["single", cluster]
    metafunc.parametrize("topology", params, indirect=True)


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """``single``, or ``cluster`` in the cluster run of a test marked ``cluster``."""
    return str(getattr(request, "param", "single"))


@pytest.fixture
def stack(request: pytest.FixtureRequest, topology: str) -> Endpoints:
    """The endpoints of this test's topology (see :func:`topology`)."""
    return request.getfixturevalue("cluster_stack" if topology == "cluster" else "single_stack")


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(ROOT / "compose" / "docker-compose.yml")


@pytest.fixture(scope="session")
def docker_stack(docker_ip: str, docker_services) -> Endpoints:  # type: ignore[no-untyped-def]
    kafka = f"{docker_ip}:{docker_services.port_for('kafka', 9092)}"
    redis_url = f"redis://{docker_ip}:{docker_services.port_for('redis', 6379)}/0"
    registry = (f"http://{docker_ip}:{docker_services.port_for('schema-registry', 8080)}"
                f"{CCOMPAT_PATH}")
    docker_services.wait_until_responsive(timeout=120, pause=1, check=lambda: broker_answers(kafka))
    docker_services.wait_until_responsive(timeout=120, pause=1,
                                          check=lambda: registry_answers(registry))
    return Endpoints(kafka_bootstrap=kafka, redis_url=redis_url, kafka_managed=False,
                     redis_managed=False, schema_registry_url=registry,
                     schema_registry_managed=False)


@pytest.fixture
def kafka_bootstrap(stack: Endpoints) -> str:
    return stack.kafka_bootstrap


@pytest.fixture
def redis_url(stack: Endpoints) -> str:
    return stack.redis_url


@pytest.fixture
def schema_registry_url(stack: Endpoints) -> str:
    """The Confluent-compatible API root of the test topology's Schema Registry (one per
    topology), as SchemaRegistryClient's ``url`` takes it."""
    if stack.schema_registry_url is None:
        pytest.fail("the stack has no Schema Registry", pytrace=False)
    return stack.schema_registry_url


@pytest.fixture
def schema_registry_client(schema_registry_url: str) -> Iterator[Any]:
    """A confluent-kafka ``SchemaRegistryClient`` of the test's registry, closed at the end
    (an open one leaves sockets behind, which warnings-as-errors fails on)."""
    # eoguard's own client for a URL (SchemaRegistryConfig.connect: confluent-kafka's, with a
    # bound on each request, retried when it times out). Seen once in CI with no bound: the
    # cluster topology's registry logged its 404 to a GET the instant it came, and the client
    # waited 600 s in recv (cause not found).
    with SchemaRegistryConfig(url=schema_registry_url).connect() as client:
        yield client


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test's Redis: a ``RedisCluster`` on the cluster topology."""
    client = connect(redis_url)
    yield client  # type: ignore[misc]  # a RedisCluster answers the same keyed commands
    client.close()


@pytest.fixture
def key_prefix() -> str:
    """A Redis key prefix of this test alone, so tests never see each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Create a fresh topic (default 4 partitions) and return its name."""
    def make(partitions: int = 4, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        create_topics(kafka_bootstrap, {name: partitions})
        return name

    return make


def free_port() -> int:
    """A loopback TCP port nobody uses right now, below Linux's ephemeral range (32768+).

    A test that SIGKILLs a server restarts it on the same port; an ephemeral port may by then
    be the source port of some client's connection, and the restart fails to bind (a chaos
    run's Kafka node did: "Address already in use"). Ports below the range are never handed
    out as source ports.
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(23_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port in 23000-31999")


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
CLUSTER_BUS_OFFSET = 10_000  # a cluster-mode redis-server's bus listens on port + 10000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral (client source) port range, first and last; Linux's default
    32768-60999 where it cannot be read."""
    try:
        first, last = (int(n) for n in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return first, last


def _free(*ports: int) -> bool:
    """Whether every one of ``ports`` can be bound on loopback right now (all at once)."""
    socks: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()
    return True


def free_cluster_port() -> int:
    """A port P for a cluster-mode redis-server, whose cluster bus listens on P + 10000.

    At the time of the call P and P + 10000 are both free on loopback (bound together as a
    test) and both below the kernel's ephemeral range, so neither is handed out as a client's
    source port before the server binds it (a bus port inside the range once kept a node
    from starting), and P + 10000 is a valid port. With the usual range P is in 10000-12999,
    its bus in 20000-22999: clear of :func:`free_port`'s picks and the local stack's ports.
    Another process may still bind one of them meanwhile.
    """
    first = ephemeral_range()[0]
    top = min(13_000, first - CLUSTER_BUS_OFFSET)  # exclusive
    bottom = max(1_024, top - 3_000)
    if top <= bottom:
        raise RuntimeError(f"the ephemeral port range starts at {first}: no room below it for "
                           "a cluster port and its bus (port + 10000)")
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(bottom, top)
        if _free(port, port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError(f"no free loopback port in {bottom}-{top - 1} with a free bus port")


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis (AOF on) of this test alone, which the test may SIGKILL and restart."""
    server = RedisServer(tmp_path / "redis", port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A single-node Kafka of this test alone, which the test may SIGKILL and restart."""
    port = free_port()
    broker = KafkaBroker(tmp_path / "kafka", port=port, controller_port=free_port())
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession (local[2], 2 shuffle partitions) with the connector jars.

    Jars come from ``eoguard.stack.spark_jars()`` through ``spark.jars`` (nothing is downloaded
    at start). Python workers run this interpreter (they import eoguard, eoguard_spark, pyarrow).
    Fails, never skips, when pyspark or the jars are missing.
    """
    try:
        from pyspark.sql import SparkSession  # noqa: PLC0415 - only Spark tests need it
    except ImportError as exc:  # pragma: no cover - eoguard-spark is part of `make test`
        pytest.fail(f"pyspark is not installed ({exc}); pip install ./connectors/spark", pytrace=False)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        jars = spark_jars()
    except StackError as exc:
        pytest.fail(f"the Spark connector jars are missing: {exc}", pytrace=False)
    missing = [jar for jar in jars.split(",") if not os.path.isfile(jar)]
    if not jars or missing:
        pytest.fail(f"the Spark connector jars are missing: {missing or 'none resolved'}",
                    pytrace=False)
    from eoguard_spark.avro_schema import avro_session_conf  # noqa: PLC0415
    from eoguard_spark.redaction import redaction_conf  # noqa: PLC0415

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("eoguard-spark-tests")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    # as the job's own sessions (local_session): secrets redacted, Avro's reader capped
    for key, value in {**redaction_conf(), **avro_session_conf()}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture
def limited_client(request: pytest.FixtureRequest, redis_client: redis.Redis,
                   key_prefix: str) -> Iterator[redis.Redis]:
    """A client of an ACL user that may not run some commands (SADD and HGET unless the test
    is marked ``@pytest.mark.denied("-sadd", ...)``): Redis then fails a command the effect
    check passed (the check reads the data, it does not model ACLs)."""
    marker = request.node.get_closest_marker("denied")
    denied = list(marker.args) if marker else ["-sadd", "-hget"]
    with acl_user(redis_client, key_prefix, *denied) as client:
        yield client
