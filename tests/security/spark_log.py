"""Spark's own log, copied into a file while a block runs (its console is a JVM's stderr,
which pytest's per-test capture does not see)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_APPENDER = "eoguard-security-test"


@contextmanager
def spark_log(spark: SparkSession, path: Path, level: str = "INFO") -> Iterator[Path]:
    """Add a log4j2 file appender to the root logger and raise Spark's level to ``level``
    for the block; WARN again after it."""
    jvm = spark._jvm  # type: ignore[attr-defined]  # py4j's view of the driver JVM
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    core = jvm.org.apache.logging.log4j.core
    appender = (core.appender.FileAppender.newBuilder().setName(_APPENDER)
                .withFileName(str(path))
                .setLayout(core.layout.PatternLayout.createDefaultLayout(config))
                .setConfiguration(config).build())
    appender.start()
    root = config.getRootLogger()
    root.addAppender(appender, None, None)
    context.updateLoggers()
    spark.sparkContext.setLogLevel(level)
    try:
        yield path
    finally:
        spark.sparkContext.setLogLevel("WARN")
        root.removeAppender(_APPENDER)
        context.updateLoggers()
        appender.stop()
