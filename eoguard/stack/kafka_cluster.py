"""Three Kafka KRaft nodes on loopback, each broker and controller at once (combined mode).

Combined nodes keep the stack to three JVMs on a small machine. The price: killing a node
kills a broker and a controller voter together; two of three voters still form a quorum, so
the cluster elects new partition leaders and goes on, but a second death stops it. Topics get
replication factor 3 and ``min.insync.replicas=2`` by default, the offsets topic too.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from eoguard.stack.group import ServiceGroup
from eoguard.stack.kafka_broker import KafkaBroker, broker_answers

NODES = 3


class KafkaCluster(ServiceGroup):
    """The three nodes: brokers on ``port..port+2``, controllers on the next three ports."""

    name = "kafka-cluster"

    def __init__(self, workdir: Path, *, port: int = 19192, heap: str = "384m",
                 ready_timeout_s: float = 120.0) -> None:
        self.port = port
        voters = ",".join(f"{i + 1}@127.0.0.1:{port + NODES + i}" for i in range(NODES))
        cluster_id = _cluster_id(workdir)
        super().__init__(workdir, [
            KafkaBroker(workdir / f"node{i + 1}", port=port + i, controller_port=port + NODES + i,
                        ready_timeout_s=ready_timeout_s, heap=heap, node_id=i + 1,
                        voters=voters, cluster_id=cluster_id, replicas=NODES)
            for i in range(NODES)
        ])

    @property
    def address(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(NODES))

    def is_ready(self) -> bool:
        """Every node answers metadata requests."""
        return all(broker_answers(f"127.0.0.1:{self.port + i}") for i in range(NODES))


def _cluster_id(workdir: Path) -> str:
    """One id for all nodes, kept in the workdir so a restart formats nothing anew."""
    path = workdir / "cluster-id"
    if not path.is_file():
        workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(uuid.uuid4().hex[:22])
    return path.read_text().strip()
