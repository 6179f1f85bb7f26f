"""The job on topics in the header wire format (issue 36), real Kafka, Redis, Schema Registry
and Spark: envelopes and header records of the same orders come out one row per order, with
the same decoded payload; bad header records are dead letters with their reasons; a schema
version registered while the query runs stops a micro-batch, and ``run`` starts the query
again with it: the record is read, never dead-lettered."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from eoguard import ConfigError, SchemaRegistry, SchemaRegistryConfig, WireFormat, message_id_for
from eoguard.codec.registry_payloads import frame
from eoguard.producer.guarded import GuardedProducer
from tests.integration.test_header_format import _marked, an_order
from tests.integration.test_producer import make_config
from tests.schema_versions import ORDER, schema_dir
from tests.spark.test_job_plain import job_output

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def producer(kafka_bootstrap: str, redis_url: str, key_prefix: str, url: str | None,
             schemas: SchemaRegistry | None = None) -> GuardedProducer:
    """An envelope producer (``url`` None) or one in the header format."""
    extra: dict[str, Any] = {} if url is None else {
        "wire_format": WireFormat.HEADERS, "schema_registry": SchemaRegistryConfig(url=url)}
    return GuardedProducer(make_config(kafka_bootstrap, redis_url, key_prefix, **extra),
                           registry=schemas)


def test_envelopes_and_header_records_come_out_alike_once_per_order(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job,
        schema_registry_url) -> None:
    topic = new_topic(2)
    ids = {n: message_id_for("orders", str(n)) for n in range(60)}
    with producer(kafka_bootstrap, redis_url, key_prefix, None) as envelopes:
        for n in range(40):
            envelopes.send(topic, an_order(n), schema=ORDER, message_id=ids[n])
        assert envelopes.flush(30) == 0
    with producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as moved:
        for n in range(20, 60):
            moved.send(topic, an_order(n), schema=ORDER, message_id=ids[n])
        first = moved.send(topic, an_order(99), schema=ORDER)  # registers, gives the id
        assert moved.flush(30) == 0
    client = SchemaRegistryClient({"url": schema_registry_url})
    try:
        known = client.get_latest_version(f"{topic}-value").schema_id
    finally:
        client.close()
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    bad = {"bad prefix": (b"{\"order_id\": 3}", _marked(), "starts with 7b, expected 00"),
           "missing header": (frame(known, b"\x00"), _marked(ce_id=None),
                              "missing header ce_id")}
    for value, heads, _ in bad.values():
        raw.produce(topic, value, headers=heads)
    raw.flush(30)

    options = job_options([topic], payload_schema=ORDER, key_shards=8,
                          schema_registry_url=schema_registry_url)
    stats = run_job(options)
    out, dead = job_output(spark, options, stats)
    assert out == Counter({*ids.values(), first.id})
    rows = {r["id"]: r for r in spark.read.parquet(options.output_path).collect()}
    for n in (0, 30, 59):  # an envelope's, a copy in both formats, a header record's
        payload = rows[ids[n]]["payload"].asDict(recursive=True)
        assert payload["order_id"] == str(n)
        assert payload["amount"] == an_order(n)["amount"]
    reasons = sorted(r["reason"] for r in dead)
    assert len(reasons) == len(bad)
    for name, (_, _, want) in bad.items():
        assert any(want in reason for reason in reasons), (name, reasons)


def test_raw_header_records_need_no_registry_and_an_avro_one_stops_the_job_asking_for_it(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options, run_job,
        schema_registry_url) -> None:
    """``header_format`` alone reads raw payloads; an Avro payload stops the job with a
    ConfigError naming the option, nothing of its batch committed; with a registry the same
    checkpoint goes on and reads it."""
    from eoguard_spark import run  # noqa: PLC0415

    topic = new_topic(1)
    with producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as p:
        raw = [p.send(topic, b"order %d" % n) for n in range(3)]
        assert p.flush(30) == 0
    options = job_options([topic], key_shards=8, header_format=True)
    run_job(options)
    ids = {r["id"]: bytes(r["payload"]) for r in spark.read.parquet(options.output_path).collect()}
    assert ids == {h.id: b"order %d" % n for n, h in enumerate(raw)}
    with producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as p:
        avro = p.send(topic, an_order(7), schema=ORDER)
        assert p.flush(30) == 0
    with pytest.raises(ConfigError, match=r"schema_registry_url \(--schema-registry-url\)"):
        run(options, spark=spark)
    assert len(spark.read.parquet(options.output_path).collect()) == 3
    run_job(dataclasses.replace(options, schema_registry_url=schema_registry_url))
    rows = spark.read.parquet(options.output_path).collect()
    assert Counter(r["id"] for r in rows) == Counter([*ids, avro.id])


@pytest.mark.parametrize(("partitions", "beside"), [(1, 0), (4, 12)])
def test_a_schema_version_registered_mid_stream_is_read(
        spark, new_topic, kafka_bootstrap, redis_url, key_prefix, job_options,
        schema_registry_url, tmp_path, partitions: int, beside: int) -> None:
    """With ``beside`` records of the known version in the same micro-batch, on other
    partitions (their tasks may finish before the new id stops the batch): each order comes
    out once, none missing, none twice, across the restart."""
    from eoguard_spark import run  # noqa: PLC0415

    topic = new_topic(partitions)
    older = SchemaRegistry.from_dir(schema_dir(tmp_path, "older"))
    newer = SchemaRegistry.from_dir(schema_dir(tmp_path, "newer"))
    with producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url, older) as p:
        for n in range(5):
            p.send(topic, an_order(n), schema=ORDER)
        assert p.flush(30) == 0
    options = job_options([topic], available_now=False, trigger_interval="1 second", key_shards=8,
                          schema_registry_url=schema_registry_url, payload_schema=ORDER,
                          schema_dir=str(schema_dir(tmp_path, "newer")))
    batches: list[Any] = []
    failure: list[BaseException] = []

    def job() -> None:
        try:
            run(options, spark=spark, on_batch=batches.append)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    try:
        _wait_rows(spark, options, 5, batches, failure)
        renewed = {k: v for k, v in an_order(9).items() if k != "note"} | {"gift_wrap": True}
        with producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                      newer) as p:  # the second version, registered now
            p.send(topic, renewed, schema=ORDER)
            with producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                          older) as q:  # the known version, beside it in the batch
                for n in range(10, 10 + beside):
                    q.send(topic, an_order(n), schema=ORDER)
                assert q.flush(30) == 0
            assert p.flush(30) == 0
        _wait_rows(spark, options, 6 + beside, batches, failure)
    finally:
        for query in spark.streams.active:
            query.stop()
        thread.join(120)
    assert not failure, failure
    rows = spark.read.parquet(options.output_path).collect()
    payloads = {r["payload"]["order_id"]: r["payload"]["gift_wrap"] for r in rows}
    assert len(rows) == len(payloads)  # none twice
    assert payloads == {"0": False, "1": False, "2": False, "3": False, "4": False, "9": True,
                        **{str(n): False for n in range(10, 10 + beside)}}
    dead = spark.read.parquet(options.dead_letter_path).collect() \
        if any(b.rows.get("malformed") for b in batches) else []
    assert dead == []


def _wait_rows(spark: Any, options: Any, count: int, batches: list[Any],
               failure: list[BaseException]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not failure:
        if sum(b.rows.get("new", 0) + b.rows.get("mine", 0) for b in batches) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"{count} rows not written: {failure or batches}")
