"""The local stack used by the demo, the tests and the benchmarks: Kafka (KRaft), Redis, jars."""

from eoguard.stack.jars import resolve, spark_jars
from eoguard.stack.local import Endpoints, LocalStack

__all__ = ["Endpoints", "LocalStack", "resolve", "spark_jars"]
