"""The local stack: Kafka, Redis and a Schema Registry, reused from the environment or started here.

Two topologies. ``single`` (the default): one Kafka broker and one Redis. ``cluster``: three
Kafka KRaft nodes (replication factor 3, ``min.insync.replicas=2``) and a Redis Cluster of
three masters with a replica each; ``EOGUARD_TOPOLOGY=cluster`` or ``--topology cluster``
picks it. Both have one Schema Registry (Apicurio Registry, see
:mod:`eoguard.stack.schema_registry`). Each topology reads its own variables, so a test
session can run both: ``EOGUARD_KAFKA_BOOTSTRAP`` / ``EOGUARD_REDIS_URL`` /
``EOGUARD_SCHEMA_REGISTRY_URL`` (``EOGUARD_CLUSTER_KAFKA_BOOTSTRAP`` / ...) name services to use
instead of starting any; otherwise the stack starts its own on loopback ports
(``EOGUARD_KAFKA_PORT`` / ``EOGUARD_REDIS_PORT`` / ``EOGUARD_SCHEMA_REGISTRY_PORT``, or the
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
from eoguard.stack.group import ServiceGroup
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.kafka_cluster import KafkaCluster
from eoguard.stack.paths import cache_dir
from eoguard.stack.process import ManagedProcess
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer
from eoguard.stack.schema_registry import SchemaRegistry

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
    # The Confluent-compatible API's root, as SchemaRegistryClient takes it ({"url": ...}).
    schema_registry_url: str | None = None
    schema_registry_managed: bool = False

    def as_env(self) -> dict[str, str]:
        """The environment that points another process at these services."""
        env = {"EOGUARD_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "EOGUARD_REDIS_URL": self.redis_url}
        if self.schema_registry_url is not None:
            env["EOGUARD_SCHEMA_REGISTRY_URL"] = self.schema_registry_url
        return env

    def shown_env(self) -> dict[str, str]:
        """:meth:`as_env` fit to print: the URLs' passwords redacted."""
        return {name: value if name == "EOGUARD_KAFKA_BOOTSTRAP" else redact_url(value)
                for name, value in self.as_env().items()}


class LocalStack:
    """Starts, finds and stops the project's own Kafka, Redis and Schema Registry processes."""

    def __init__(self, root: Path | None = None, *, topology: str | None = None) -> None:
        self.topology = topology or default_topology()
        if self.topology not in TOPOLOGIES:
            raise StackError(f"unknown topology {self.topology!r}; expected one of {TOPOLOGIES}")
        self.env = "EOGUARD_" if self.topology == "single" else "EOGUARD_CLUSTER_"
        single = self.topology == "single"
        kafka_port = int(os.environ.get(f"{self.env}KAFKA_PORT", "19092" if single else "19192"))
        redis_port = int(os.environ.get(f"{self.env}REDIS_PORT", "16379" if single else "17001"))
        registry_port = int(os.environ.get(f"{self.env}SCHEMA_REGISTRY_PORT",
                                           "18081" if single else "18181"))
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
        self.schema_registry = SchemaRegistry(self.root / "schema_registry", port=registry_port)

    def endpoints(self) -> Endpoints:
        """Endpoints without starting anything."""
        kafka_env = os.environ.get(f"{self.env}KAFKA_BOOTSTRAP")
        redis_env = os.environ.get(f"{self.env}REDIS_URL")
        registry_env = os.environ.get(f"{self.env}SCHEMA_REGISTRY_URL")
        return Endpoints(
            kafka_bootstrap=kafka_env or self.kafka.address,
            redis_url=redis_env or self.redis.address,
            kafka_managed=not kafka_env,
            redis_managed=not redis_env,
            schema_registry_url=registry_env or self.schema_registry.address,
            schema_registry_managed=not registry_env,
        )

    def _services(self) -> dict[str, ManagedProcess | ServiceGroup]:
        """Each service by its name, in the order ``down`` stops them (``up``: reversed)."""
        return {"kafka": self.kafka, "redis": self.redis, "schema_registry": self.schema_registry}

    def _managed(self, ends: Endpoints) -> dict[str, bool]:
        return {"kafka": ends.kafka_managed, "redis": ends.redis_managed,
                "schema_registry": ends.schema_registry_managed}

    def managed_services(self) -> list[str]:
        """The services this stack starts and stops (those no environment variable names)."""
        managed = self._managed(self.endpoints())
        return [name for name in self._services() if managed[name]]

    def up(self) -> tuple[Endpoints, list[str]]:
        """Start what is not already running; return the endpoints and the services started."""
        ends = self.endpoints()
        managed = self._managed(ends)
        started: list[str] = []
        try:
            for name, service in reversed(self._services().items()):
                if managed[name] and service.start():
                    started.append(name)
        except BaseException:
            if started:
                self.down(started)  # what this call started goes down with it
            raise
        return ends, started

    def down(self, services: list[str] | None = None, *, clean: bool = False) -> None:
        """Stop the named managed services (all by default); ``clean`` also deletes their data."""
        wanted = services or list(self._services())
        managed = self._managed(self.endpoints())
        for name, service in self._services().items():
            if name in wanted and managed[name]:
                service.stop()
        if clean:
            for name in wanted:
                shutil.rmtree(self.root / name, ignore_errors=True)

    def keep(self, services: list[str]) -> None:
        """Leave the named services this object started running past it (a test session kept
        its stack for the next one): their pid files name them, ``down`` stops them later."""
        for name, service in self._services().items():
            if name in services:
                service.detach()

    def status(self) -> dict[str, dict[str, object]]:
        """Per service: address, whether the stack manages it, pid, and readiness."""
        ends = self.endpoints()
        managed = self._managed(ends)
        addresses = {"kafka": ends.kafka_bootstrap, "redis": redact_url(ends.redis_url),
                     "schema_registry": redact_url(ends.schema_registry_url or "")}
        return {
            name: {"address": addresses[name], "managed": managed[name],
                   "pid": service.pid() if managed[name] else None,
                   "ready": service.is_ready() if managed[name] else None,
                   "log": str(service.log_path)}
            for name, service in self._services().items()
        }
