"""A single-node Apache Kafka broker in KRaft mode, run from its Maven Central jars on Java 17."""

from __future__ import annotations

import logging
import subprocess
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from eoguard.errors import StackError
from eoguard.stack import jars
from eoguard.stack.java import find_java
from eoguard.stack.process import ManagedProcess
from eoguard.stack.tls import Security, write_private

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = warn
logger.apache.name = org.apache.kafka
logger.apache.level = warn
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""

# Three nodes share two cores with Redis and the tests: fewer threads each, and a replica that
# lags 10 s (not 30) leaves the ISR, so acks=all moves on quickly after a node dies.
_SMALL_NODE = ["num.network.threads=2", "num.io.threads=2", "background.threads=2",
               "replica.lag.time.max.ms=10000"]

# librdkafka logs every refused connection while the broker boots; readiness probes stay quiet.
_QUIET = logging.getLogger("eoguard.stack.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


SCRAM_MECHANISM = "SCRAM-SHA-512"


class KafkaBroker(ManagedProcess):
    """Broker and controller in one process on loopback; data persists across restarts.

    With ``security`` and ``secure_port`` a second client listener, SASL_SSL on
    ``secure_port``, takes SCRAM-SHA-512 logins of ``security.users`` (written into the
    metadata log when the storage is formatted) over TLS; the PLAINTEXT listener (the
    readiness probe, topic creation) and the controller stay on loopback.
    """

    name = "kafka"

    def __init__(self, workdir: Path, *, port: int = 19092, controller_port: int = 19093,
                 ready_timeout_s: float = 90.0, heap: str = "768m", node_id: int = 1,
                 voters: str | None = None, cluster_id: str | None = None,
                 replicas: int = 1, security: Security | None = None,
                 secure_port: int | None = None) -> None:
        super().__init__(workdir, ready_timeout_s=ready_timeout_s)
        if (security is None) != (secure_port is None):
            raise StackError("a secured broker needs both security= and secure_port=")
        self.port = port
        self.security = security
        self.secure_port = secure_port
        self.controller_port = controller_port
        self.heap = heap  # the JVM's -Xmx
        self.node_id = node_id
        # A cluster's members share the voter list and the cluster id (KafkaCluster sets them).
        self.voters = voters or f"{node_id}@127.0.0.1:{controller_port}"
        self.cluster_id = cluster_id
        self.replicas = replicas  # replication factor of new topics and the internal topics

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_address(self) -> str:
        """The SASL_SSL listener's bootstrap address (a secured broker only)."""
        if self.secure_port is None:
            raise StackError("this broker has no SASL_SSL listener")
        return f"127.0.0.1:{self.secure_port}"

    @property
    def _data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def _keystore(self) -> Path:
        return self.workdir / "keystore.pem"

    def _listener_lines(self) -> list[str]:
        plain = f"PLAINTEXT://127.0.0.1:{self.port}"
        controller = f"CONTROLLER://127.0.0.1:{self.controller_port}"
        if self.security is None:
            return [f"listeners={plain},{controller}", f"advertised.listeners={plain}",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"]
        secure = f"SASL_SSL://127.0.0.1:{self.secure_port}"
        prefix = "listener.name.sasl_ssl"
        return [
            f"listeners={plain},{controller},{secure}",
            f"advertised.listeners={plain},{secure}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
            "SASL_SSL:SASL_SSL",
            f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
            f"{prefix}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"{prefix}.ssl.keystore.type=PEM",
            f"{prefix}.ssl.keystore.location={self._keystore}",
        ]

    def _properties(self) -> str:
        return "\n".join([
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            f"controller.quorum.voters={self.voters}",
            *self._listener_lines(),
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self._data_dir}",
            "num.partitions=4",
            f"default.replication.factor={self.replicas}",
            f"min.insync.replicas={min(2, self.replicas)}",
            f"offsets.topic.replication.factor={self.replicas}",
            "offsets.topic.num.partitions=8",
            f"transaction.state.log.replication.factor={self.replicas}",
            f"transaction.state.log.min.isr={min(2, self.replicas)}",
            *(_SMALL_NODE if self.replicas > 1 else []),
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "log.retention.hours=24",
            "",
        ])

    def _java(self) -> str:
        return find_java(17, purpose="Kafka")

    def _classpath(self) -> str:
        return str(jars.resolve("kafka")[0].parent / "*")

    def prepare(self) -> None:
        props = self.workdir / "server.properties"
        props.write_text(self._properties())
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        if self.security is not None:
            # A PEM keystore is one file: the private key, then the certificate chain.
            tls = self.security.tls
            write_private(self._keystore, tls.key.read_text() + tls.cert.read_text())
        if (self._data_dir / "meta.properties").is_file():
            return  # formatted by an earlier start: keep the log (a restart is not a reset)
        cluster_id = self.cluster_id or uuid.uuid4().hex[:22]
        done = subprocess.run(
            [self._java(), "-cp", self._classpath(), "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(props), *self._scram_arguments()],
            capture_output=True, text=True, check=False, timeout=120,
        )
        if done.returncode != 0:
            raise StackError(f"formatting Kafka storage failed: {done.stdout}{done.stderr}".strip())

    def _scram_arguments(self) -> list[str]:
        """The SCRAM credentials the format writes into the metadata log (``--add-scram``).

        The format's command line is the one place the passwords pass as arguments: it
        runs for a second, before the broker exists, on the machine that holds them anyway.
        """
        if self.security is None:
            return []
        out: list[str] = []
        for name, password in self.security.users.items():
            out += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        return out

    def command(self) -> list[str]:
        return [
            self._java(), "-Xms128m", f"-Xmx{self.heap}", "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp", self._classpath(), "kafka.Kafka", str(self.workdir / "server.properties"),
        ]

    def is_ready(self) -> bool:
        return broker_answers(self.address)


def broker_answers(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """True when a metadata request to ``bootstrap`` is answered with at least one broker."""
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "logger": _QUIET, "log_level": 0}
    admin = AdminClient(conf)  # type: ignore[arg-type]  # "logger" takes a Logger; the stubs omit it
    try:
        return bool(admin.list_topics(timeout=timeout_s).brokers)
    except Exception:  # noqa: BLE001 - any failure of the probe means "not ready yet"
        return False
