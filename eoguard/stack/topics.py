"""Create Kafka topics on a local broker: the demo, the tests and the benchmarks share this."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from eoguard.errors import BrokerError


def create_topics(bootstrap: str, partitions: Mapping[str, int], *,
                  timeout_s: float = 30.0) -> None:
    """Create each topic with its partition count and wait for it.

    The replication factor and ``min.insync.replicas`` are the broker's defaults: 1 on the
    single-node stack, 3 and 2 on the cluster topology.

    Raises :class:`BrokerError` naming the topic that could not be created; a topic that
    already exists is an error too (every caller creates fresh, uniquely named topics).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    futures = admin.create_topics([NewTopic(name, num_partitions=count, replication_factor=-1)
                                   for name, count in partitions.items()])
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"cannot create topic {name} at {bootstrap}: {exc}") from exc
