"""Apicurio Registry on loopback: the stack's Schema Registry, spoken to through its
Confluent-compatible API (``/apis/ccompat/v7``), which confluent-kafka's
``SchemaRegistryClient``, ``AvroSerializer`` and ``AvroDeserializer`` use unchanged.

The distribution comes from Maven Central (the ``registry`` set of :mod:`eoguard.stack.jars`)
and is unpacked once into the cache. Choices a Confluent user would otherwise trip on:

* the global compatibility is BACKWARD, Confluent's default (Apicurio's own is NONE);
* schemas live in an H2 file under the workdir, not in memory: Kafka keeps its records
  across a restart, so the ids framed in them must keep naming the same schemas;
* the management interface (health, metrics), which binds 0.0.0.0:9000 by default, listens
  on loopback beside the API, on the next port.
"""

from __future__ import annotations

import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from eoguard.errors import StackError
from eoguard.stack import jars
from eoguard.stack.java import find_java
from eoguard.stack.paths import cache_dir
from eoguard.stack.process import ManagedProcess

CCOMPAT_PATH = "/apis/ccompat/v7"
COMPATIBILITY = "BACKWARD"
JAVA_MINIMUM = 21  # Apicurio Registry 3 is built for Java 21
_LAUNCHER = "quarkus-run.jar"


def registry_java() -> str:
    """The ``java`` the registry runs on (the first of Java 21 or newer, see eoguard.stack.java)."""
    return find_java(JAVA_MINIMUM, purpose="Apicurio Registry (the stack's Schema Registry)")


def distribution() -> Path:
    """The unpacked distribution (the folder holding ``quarkus-run.jar``), resolving and
    unpacking it on first use. Unpacked beside, then renamed: a cut-short unpack is never used."""
    archives = jars.resolve("registry")
    if len(archives) != 1:
        raise StackError(f"the registry set should be one tar.gz, found {[a.name for a in archives]}")
    archive = archives[0]
    home = cache_dir() / "registry" / archive.name.removesuffix(".tar.gz")
    if (home / _LAUNCHER).is_file():
        return home
    partial = home.with_name(home.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    extra: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(partial, **extra)  # noqa: S202 - Maven Central's artifact, data filter
    except (OSError, tarfile.TarError) as exc:
        raise StackError(f"unpacking {archive} failed: {exc}") from exc
    if not (partial / _LAUNCHER).is_file():
        raise StackError(f"{archive} holds no {_LAUNCHER}; is it Apicurio's 'all' distribution?")
    partial.rename(home)
    return home


class SchemaRegistry(ManagedProcess):
    """One Apicurio Registry: the API on ``port``, the management interface on ``port + 1``,
    both on 127.0.0.1; its H2 database in ``workdir/data`` persists across restarts."""

    name = "schema-registry"

    def __init__(self, workdir: Path, *, port: int = 18081, ready_timeout_s: float = 90.0,
                 heap: str = "256m") -> None:
        super().__init__(workdir, ready_timeout_s=ready_timeout_s)
        self.port = port
        self.management_port = port + 1
        self.heap = heap  # the JVM's -Xmx

    @property
    def address(self) -> str:
        """The URL a Confluent Schema Registry client takes (the ccompat API's root)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def prepare(self) -> None:
        (self.workdir / "data").mkdir(exist_ok=True)
        distribution()  # resolved before the launch, not inside the ready timeout

    def command(self) -> list[str]:
        settings = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": self.port,
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": self.management_port,
            "quarkus.http.access-log.enabled": "false",
            "apicurio.rules.global.compatibility": COMPATIBILITY,
            # WRITE_DELAY=0: each commit reaches the file at once (H2 batches them for up to 0.5 s
            # by default), so a registration acknowledged before a SIGKILL is still there.
            "apicurio.datasource.url":
                f"jdbc:h2:file:{self.workdir / 'data' / 'registry'};WRITE_DELAY=0",
            # The default pool opens 20 connections at start, for one developer's registry.
            "apicurio.datasource.jdbc.initial-size": 2,
            "apicurio.datasource.jdbc.min-size": 2,
            "apicurio.datasource.jdbc.max-size": 20,
        }
        return [
            registry_java(),
            "-Xms64m", f"-Xmx{self.heap}", "-Djava.awt.headless=true",
            *(f"-D{key}={value}" for key, value in settings.items()),
            "-jar", str(distribution() / _LAUNCHER),
        ]

    def is_ready(self) -> bool:
        return registry_answers(self.address)


def registry_answers(url: str, timeout_s: float = 1.0) -> bool:
    """True when the Confluent-compatible API at ``url`` lists its subjects."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout_s) as reply:  # noqa: S310 - http(s) only: the stack's own URL
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
