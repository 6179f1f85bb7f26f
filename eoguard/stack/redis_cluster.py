"""A Redis Cluster on loopback: three masters with one replica each, AOF on every node.

Nodes are Debian's ``redis-server`` in cluster mode on ``port..port+5`` (their cluster bus on
``port+10000..``) with a 2 s ``cluster-node-timeout``, so a replica takes over a dead master
within a few seconds. ``redis-cli --cluster create --cluster-replicas 1`` joins them on the
first start; later starts find the cluster again from each node's ``nodes.conf``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from eoguard.errors import StackError
from eoguard.stack.group import ServiceGroup
from eoguard.stack.redis_server import RedisServer

MASTERS = 3
NODES = 2 * MASTERS
SLOTS = 16384


class RedisClusterNodes(ServiceGroup):
    """Starts, joins, finds and stops the six nodes of a local Redis Cluster."""

    name = "redis-cluster"

    # The default ports 17001..17006 and their buses 27001..27006 lie below Linux's ephemeral
    # range (32768-60999 by default), so no client connection holds one as its source port
    # when a node (re)starts and binds it. A port chosen by EOGUARD_CLUSTER_REDIS_PORT should
    # keep port + 10005 below the range too.
    def __init__(self, workdir: Path, *, port: int = 17001, node_timeout_ms: int = 2000,
                 ready_timeout_s: float = 60.0) -> None:
        self.port = port
        self.ready_timeout_s = ready_timeout_s
        self.servers = [RedisServer(workdir / f"node{i + 1}", port=port + i,
                                    ready_timeout_s=ready_timeout_s,
                                    cluster_node_timeout_ms=node_timeout_ms)
                        for i in range(NODES)]
        super().__init__(workdir, self.servers)

    @property
    def address(self) -> str:
        """A seed node's URL: a cluster client discovers the others from it."""
        return self.servers[0].address

    @property
    def log_path(self) -> Path:
        """The join step's log; each node logs to its own ``node<N>/service.log``."""
        return self.workdir / "create.log"

    def joined(self) -> None:
        """Join the nodes on first use, then wait until every slot is served."""
        self._check_ports()
        if self._known_nodes() < NODES:
            self._create()
        self._wait_ok()

    def is_ready(self) -> bool:
        """Every node says ``cluster_state:ok`` with all slots served, each master has a
        replica, and every replica is in sync (``master_link_status:up``): a replica still
        syncing could not take over."""
        try:
            infos = [_cluster_info(node) for node in self.servers]
            links = [_replication(node) for node in self.servers]
        except redis.RedisError:
            return False
        slots_ok = all(info.get("cluster_state") == "ok"
                       and int(info.get("cluster_slots_ok", 0)) == SLOTS for info in infos)
        replicated = sum(1 for link in links if link.get("role") == "master"
                         and int(str(link.get("connected_slaves", 0))) >= 1) == MASTERS
        in_sync = sum(1 for link in links if link.get("role") == "slave"
                      and link.get("master_link_status") == "up") == NODES - MASTERS
        return slots_ok and replicated and in_sync

    def stop(self) -> None:
        """Stop the six nodes, and a shard a test added (``eoguard.stack.redis_shard``) and
        left behind."""
        super().stop()
        for node in self.added_nodes():
            node.stop()

    def added_nodes(self) -> list[RedisServer]:
        """The two nodes an added shard runs on (``port + 6``, ``port + 7``; see
        :mod:`eoguard.stack.redis_shard`), whether they run or not."""
        timeout_ms = self.servers[0].cluster_node_timeout_ms
        return [RedisServer(self.workdir / f"node{NODES + 1 + i}", port=self.port + NODES + i,
                            ready_timeout_s=self.ready_timeout_s,
                            cluster_node_timeout_ms=timeout_ms) for i in range(2)]

    def _check_ports(self) -> None:
        """A cluster joined on other ports cannot come up on these: each node's ``nodes.conf``
        names its peers by their old ports. Say so, instead of timing out as not ready. (The
        ports of an added shard are the cluster's own.)"""
        own = [node.port for node in self.servers]
        ports = {*own, *(node.port for node in self.added_nodes())}
        recorded: set[int] = set()
        for node in self.servers:
            conf = node.workdir / "nodes.conf"
            if conf.exists():
                for line in conf.read_text().splitlines():
                    parts = line.split()
                    if len(parts) > 1 and ":" in parts[1]:
                        port = int(parts[1].split(":")[1].split("@")[0] or 0)
                        if port:  # 0: a node not met yet (handshake)
                            recorded.add(port)
        if recorded - ports:
            raise StackError(
                f"{self.workdir} holds a Redis Cluster joined on ports "
                f"{', '.join(map(str, sorted(recorded)))}, not {min(own)}..{max(own)}: start "
                f"it on those ports, or remove {self.workdir} (its data) to make a new one")

    def _known_nodes(self) -> int:
        return int(_cluster_info(self.servers[0]).get("cluster_known_nodes", 1))

    def _create(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise StackError("redis-cli is missing (Debian's redis-server package provides it; "
                             "it is called redis-tools on its own)")
        cmd = [cli, "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in self.servers),
               "--cluster-replicas", "1", "--cluster-yes"]
        with self.log_path.open("ab") as log:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False,
                                  timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise StackError(f"redis-cli --cluster create failed (exit {done.returncode}); "
                             f"its log is {self.log_path}")

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.is_ready():
                return
            time.sleep(0.2)
        raise StackError(f"the Redis Cluster was not ready after {self.ready_timeout_s:.0f}s "
                         f"(CLUSTER INFO not ok, or a master without replica); logs: "
                         f"{self.log_path} and {self.workdir}/node*/service.log")


def _replication(node: RedisServer) -> dict[str, object]:
    client = node.client()
    try:
        return dict(client.info("replication"))
    finally:
        client.close()


def _cluster_info(node: RedisServer) -> dict[str, str]:
    client = node.client()
    try:
        text = client.execute_command("CLUSTER INFO")
    finally:
        client.close()
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    raw = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)
