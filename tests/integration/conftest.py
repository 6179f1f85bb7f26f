"""Fixtures of the integration tests; the stack fixtures live in tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from eoguard.errors import StackError
from eoguard.stack import spark_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession (master local[2]) for the whole run, with the connector jars.

    Jars come from ``eoguard.stack.spark_jars()`` through ``spark.jars`` (nothing is
    downloaded at start). Fails, never skips, when pyspark or the jars are missing.
    """
    try:
        from pyspark.sql import SparkSession  # noqa: PLC0415 - only Spark tests need it
    except ImportError as exc:  # pragma: no cover - the [spark] extra is part of `make test`
        pytest.fail(f"pyspark is not installed ({exc}); install eoguard[spark]", pytrace=False)
    try:
        jars = spark_jars()
    except StackError as exc:
        pytest.fail(f"the Spark connector jars are missing: {exc}", pytrace=False)
    missing = [jar for jar in jars.split(",") if not os.path.isfile(jar)]
    if not jars or missing:
        pytest.fail(f"the Spark connector jars are missing: {missing or 'none resolved'}",
                    pytrace=False)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("eoguard-tests")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
