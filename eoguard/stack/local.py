"""The local stack: Kafka and Redis, reused from the environment or started here.

Two topologies. ``single`` (the default): one Kafka broker and one Redis. ``cluster``: three
Kafka KRaft nodes (replication factor 3, ``min.insync.replicas=2``) and a Redis Cluster of
three masters with a replica each; ``EOGUARD_TOPOLOGY=cluster`` or ``--topology cluster``
picks it. Each topology reads its own variables, so a test session can run both:
``EOGUARD_KAFKA_BOOTSTRAP`` / ``EOGUARD_REDIS_URL`` (``EOGUARD_CLUSTER_KAFKA_BOOTSTRAP`` /
``EOGUARD_CLUSTER_REDIS_URL``) name services to use instead of starting any; otherwise the
stack starts its own on loopback ports (``EOGUARD_KAFKA_PORT`` / ``EOGUARD_REDIS_PORT``, or the
``EOGUARD_CLUSTER_`` ones: the first of consecutive ports) under the cache folder, and ``down``
stops only what it started.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from eoguard.errors import StackError
from eoguard.redaction import redact_url
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.kafka_cluster import KafkaCluster
from eoguard.stack.paths import cache_dir
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer

TOPOLOGIES = ("single", "cluster")


def default_topology() -> str:
    """``EOGUARD_TOPOLOGY`` (``single`` or ``cluster``), ``single`` when unset."""
    return os.environ.get("EOGUARD_TOPOLOGY") or "single"


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """Where the stack's services are, and whether this stack owns them."""

    kafka_bootstrap: str
    redis_url: str
    kafka_managed: bool
    redis_managed: bool

    def as_env(self) -> dict[str, str]:
        """The environment that points another process at these services."""
        return {"EOGUARD_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "EOGUARD_REDIS_URL": self.redis_url}


class LocalStack:
    """Starts, finds and stops the project's own Kafka and Redis processes."""

    def __init__(self, root: Path | None = None, *, topology: str | None = None) -> None:
        self.topology = topology or default_topology()
        if self.topology not in TOPOLOGIES:
            raise StackError(f"unknown topology {self.topology!r}; expected one of {TOPOLOGIES}")
        self.env = "EOGUARD_" if self.topology == "single" else "EOGUARD_CLUSTER_"
        single = self.topology == "single"
        kafka_port = int(os.environ.get(f"{self.env}KAFKA_PORT", "19092" if single else "19192"))
        redis_port = int(os.environ.get(f"{self.env}REDIS_PORT", "16379" if single else "17001"))
        self.kafka: KafkaBroker | KafkaCluster
        self.redis: RedisServer | RedisClusterNodes
        if single:
            self.root = root or cache_dir() / "run"
            self.kafka = KafkaBroker(self.root / "kafka", port=kafka_port, controller_port=kafka_port + 1)
            self.redis = RedisServer(self.root / "redis", port=redis_port)
        else:
            self.root = root or cache_dir() / "run-cluster"
            self.kafka = KafkaCluster(self.root / "kafka", port=kafka_port)
            self.redis = RedisClusterNodes(self.root / "redis", port=redis_port)

    def endpoints(self) -> Endpoints:
        """Endpoints without starting anything."""
        kafka_env = os.environ.get(f"{self.env}KAFKA_BOOTSTRAP")
        redis_env = os.environ.get(f"{self.env}REDIS_URL")
        return Endpoints(
            kafka_bootstrap=kafka_env or self.kafka.address,
            redis_url=redis_env or self.redis.address,
            kafka_managed=not kafka_env,
            redis_managed=not redis_env,
        )

    def up(self) -> tuple[Endpoints, list[str]]:
        """Start what is not already running; return the endpoints and the services started."""
        ends = self.endpoints()
        started: list[str] = []
        try:
            if ends.redis_managed and self.redis.start():
                started.append("redis")
            if ends.kafka_managed and self.kafka.start():
                started.append("kafka")
        except BaseException:
            if started:
                self.down(started)  # what this call started goes down with it
            raise
        return ends, started

    def down(self, services: list[str] | None = None, *, clean: bool = False) -> None:
        """Stop the named managed services (all by default); ``clean`` also deletes their data."""
        wanted = services or ["kafka", "redis"]
        ends = self.endpoints()
        if "kafka" in wanted and ends.kafka_managed:
            self.kafka.stop()
        if "redis" in wanted and ends.redis_managed:
            self.redis.stop()
        if clean:
            for name in wanted:
                shutil.rmtree(self.root / name, ignore_errors=True)

    def keep(self, services: list[str]) -> None:
        """Leave the named services this object started running past it (a test session kept
        its stack for the next one): their pid files name them, ``down`` stops them later."""
        if "kafka" in services:
            self.kafka.detach()
        if "redis" in services:
            self.redis.detach()

    def status(self) -> dict[str, dict[str, object]]:
        """Per service: address, whether the stack manages it, pid, and readiness."""
        ends = self.endpoints()
        return {
            "kafka": {"address": ends.kafka_bootstrap, "managed": ends.kafka_managed,
                      "pid": self.kafka.pid() if ends.kafka_managed else None,
                      "ready": self.kafka.is_ready() if ends.kafka_managed else None,
                      "log": str(self.kafka.log_path)},
            "redis": {"address": redact_url(ends.redis_url), "managed": ends.redis_managed,
                      "pid": self.redis.pid() if ends.redis_managed else None,
                      "ready": self.redis.is_ready() if ends.redis_managed else None,
                      "log": str(self.redis.log_path)},
        }
