"""eoguard's Spark Structured Streaming job (docs/design.md §7): Kafka -> envelope decoding ->
expiry -> dedup against a consumer scope's Redis keys -> idempotent per-batch sinks.

Importing this package needs pyspark and pyarrow (``pip install ./connectors/spark``); the
``eoguard`` package itself never imports them.
"""

from eoguard_spark.acks import wait_for_acks
from eoguard_spark.job import (
    BatchProcessor,
    BatchStats,
    MicroBatchRunner,
    build_query,
    local_session,
    run,
)
from eoguard_spark.options import AvroFraming, DedupMode, JobOptions, PlainFormat, PlainOptions

__all__ = ["AvroFraming", "BatchProcessor", "BatchStats", "DedupMode", "JobOptions",
           "MicroBatchRunner", "PlainFormat", "PlainOptions", "build_query", "local_session", "run",
           "wait_for_acks"]
