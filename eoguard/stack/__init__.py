"""The local stack used by the demo, the tests and the benchmarks: Kafka (KRaft), Redis, jars."""

from eoguard.stack.jars import resolve, spark_jars
from eoguard.stack.local import Endpoints, LocalStack
from eoguard.stack.topics import create_topics

__all__ = ["Endpoints", "LocalStack", "create_topics", "resolve", "spark_jars"]
