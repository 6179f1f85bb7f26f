"""Plain Avro values an adversarial read found breaking the job: schemas fastavro and Spark's
parser accept but ``from_avro`` fails on every record of (now a ConfigError when the options
are made), and a value of a few bytes declaring a 2 GiB string or array, which exited the JVM
(now a dead letter: the session caps Avro's reader, and the job refuses a session that does
not)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pyspark.sql import SparkSession

from eoguard.codec.rules import InputLimits
from eoguard.errors import ConfigError
from eoguard_spark import PlainOptions
from eoguard_spark.avro_schema import AVRO_LIMITS, avro_session_conf
from tests.plain_vectors import NAMESPACE

pytestmark = pytest.mark.spark


def body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return out.getvalue()


# Schemas fastavro and Spark's Avro parser both take (no ConfigError, the query is built).
CASE_ONLY = {"type": "record", "name": "Order", "fields": [
    {"name": "Note", "type": "string"}, {"name": "note", "type": "string"},
    {"name": "order_id", "type": "long"}]}
"""Two fields whose names differ only in case: Spark's Avro deserializer matches fields
case-insensitively (spark.sql.caseSensitive=false, the default) and throws on the ambiguity
inside from_avro, which PERMISSIVE mode turns into a row of nulls for every record."""
ALIAS_OF_SIBLING = {"type": "record", "name": "Order", "fields": [
    {"name": "a", "type": "string", "aliases": ["order_id"]},
    {"name": "order_id", "type": "long"}]}
"""A field alias naming a sibling field: the job's writer/reader pair (the user schema and it
plus _eoguard_decoded) go through Avro's schema resolution, which applies reader aliases to
the writer and fails; fastavro reads the body with the one schema."""


@pytest.mark.parametrize("schema", [CASE_ONLY, ALIAS_OF_SIBLING],
                         ids=["case-only-field-names", "alias-naming-a-sibling"])
def test_a_schema_from_avro_fails_every_record_of_is_refused_up_front(
        schema: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="must differ beyond case"):
        PlainOptions(format="avro", id_namespace=NAMESPACE, ttl_s=600, id_field="order_id",
                     avro_schema=json.dumps(schema), avro_framing="none")


def test_the_sessions_cap_avros_reader_in_the_driver(spark: SparkSession) -> None:
    """The caps the job's check asks for (eoguard_spark.plain_avro.check_limits) are the
    JVM's system properties, at the job's payload limit."""
    conf = avro_session_conf()
    assert set(conf) == {"spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"}
    system = spark.sparkContext._jvm.java.lang.System
    assert all(system.getProperty(name) == str(InputLimits().payload_bytes)
               for name in AVRO_LIMITS)


_CHILD = textwrap.dedent("""
    import datetime as dt, json, os, sys
    from eoguard.codec import SchemaRegistry
    from eoguard_spark import PlainOptions
    from eoguard_spark.plain import decode_topic
    from eoguard_spark.job import local_session
    spark = local_session(conf={"spark.driver.bindAddress": "127.0.0.1",
                                "spark.driver.host": "127.0.0.1"})
    spark.sparkContext.setLogLevel("ERROR")
    schema, values = json.loads(sys.argv[1]), [bytes.fromhex(h) for h in json.loads(sys.argv[2])]
    plain = PlainOptions(format="avro", id_namespace="orders", ttl_s=600, id_field="order_id",
                         avro_schema=json.dumps(schema), avro_framing="none")
    at = dt.datetime.now(dt.timezone.utc)
    df = spark.createDataFrame([(b"k", v, "t", 0, i, at, 0, []) for i, v in enumerate(values)],
        "key binary, value binary, topic string, partition int, offset long, "
        "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>")
    rows = decode_topic(df, SchemaRegistry.default(), plain=plain).collect()
    print("STATUSES=" + json.dumps([r["status"] for r in sorted(rows, key=lambda r: r["offset"])]))
""")


def _zigzag(n: int) -> bytes:
    n, out = (n << 1) ^ (n >> 63), bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes([*out, n])


@pytest.mark.parametrize(("schema", "hostile"), [
    ({"type": "record", "name": "O", "fields": [{"name": "order_id", "type": "string"}]},
     _zigzag(2_147_483_639) + b"ab"),  # a string length of ~2 GiB, then 2 bytes: 7 bytes
    ({"type": "record", "name": "O", "fields": [
        {"name": "tags", "type": {"type": "array", "items": "long"}},
        {"name": "order_id", "type": "string"}]},
     _zigzag(2_147_483_639) + b"\x02\x00\x02a"),  # an array block count of ~2^31, 1 item
], ids=["string-length", "array-count"])
def test_a_few_byte_value_declaring_a_huge_length_is_a_dead_letter_not_a_dead_jvm(
        schema: dict[str, Any], hostile: bytes) -> None:
    """Avro's Java reader allocated the declared length before reading it (Utf8.setByteLength,
    GenericData.Array.<init>): OutOfMemoryError, which from_avro's PERMISSIVE mode does not
    catch (not NonFatal); the executor's handler exited the JVM (in local mode the driver's).
    fastavro refuses the value (EOFError): a dead letter for the consumer, and now for the job
    (local_session caps the reader: it raises, and PERMISSIVE makes the row unreadable).

    Run in a child process (a session of its own, as the job's CLI makes it)."""
    good = body(schema, {"order_id": "a"} | ({"tags": []} if len(schema["fields"]) > 1 else {}))
    with pytest.raises(EOFError):
        schemaless_reader(io.BytesIO(hostile), parse_schema(schema))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(schema),
         json.dumps([good.hex(), hostile.hex(), good.hex()])],
        capture_output=True, text=True, timeout=600, env=env, check=False)
    oom = [line for line in child.stderr.splitlines() if "OutOfMemoryError" in line]
    assert not oom, f"the JVM ran out of memory: {oom[:2]}"
    assert child.returncode == 0, child.stderr[-2000:]
    assert 'STATUSES=["ok", "malformed", "ok"]' in child.stdout
