"""``python -m eoguard_spark`` / ``spark-submit connectors/spark/eoguard_spark/__main__.py``: run the job.

Options are documented in connectors/spark/README.md and by ``--help``. Under
``spark-submit`` the session comes from spark-submit (pass the jars with ``--jars``: the list
is ``eoguard.stack.spark_jars()``, see the README); under ``python -m`` a local session is built with
``--master`` and the connector jars in ``spark.jars``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from eoguard.codec import InputLimits
from eoguard.errors import ConfigError, SecurityError, StackError
from eoguard.store.keys import DEFAULT_MAX_TTL_MS, DEFAULT_PREFIX, DEFAULT_SHARDS
from eoguard_spark.options import AvroFraming, DedupMode, JobOptions, PlainFormat, PlainOptions


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m eoguard_spark",
        description="eoguard's Spark Structured Streaming job: Kafka -> decoded envelopes -> "
                    "expiry -> dedup (a consumer scope's Redis keys, or Spark's watermark) -> "
                    "idempotent per-batch Parquet.")
    add = p.add_argument
    add("--bootstrap", help="Kafka bootstrap servers [default: $EOGUARD_KAFKA_BOOTSTRAP, else the "
                            "local stack's, 127.0.0.1:19092]")
    add("--topic", dest="topics", action="append", required=True,
        help="topic to read (repeat for several)")
    add("--scope", required=True, help="consumer scope to join (dedup namespace)")
    add("--checkpoint", required=True, help="durable checkpoint directory of this query")
    add("--output", dest="output_path", required=True,
        help="Parquet output directory (one batch_id=N directory per micro-batch)")
    add("--dead-letter", dest="dead_letter_path",
        help="Parquet directory for malformed (and expired) records, with the reason")
    add("--redis-url", help="Redis holding the dedup keys [default: $EOGUARD_REDIS_URL, else the "
                            "local stack's, redis://127.0.0.1:16379/0]")
    add("--key-prefix", default=DEFAULT_PREFIX, help="Redis key prefix (as the scope's consumers)")
    add("--key-shards", type=int, default=DEFAULT_SHARDS, help="dedup shards per scope")
    add("--max-ttl-s", type=float, default=DEFAULT_MAX_TTL_MS / 1000,
        help="the key prefix's max_ttl (as its layout records it); a record expiring later is "
             "malformed")
    add("--dedup", choices=[m.value for m in DedupMode], default=DedupMode.REDIS.value,
        help="redis: the scope's claims (default); watermark: dropDuplicatesWithinWatermark; "
             "none: no dedup")
    defaults = InputLimits()  # the input rules' limits: set them as the scope's consumers do
    add("--max-payload-bytes", type=int, default=defaults.payload_bytes,
        help="a record whose payload is larger is malformed")
    add("--max-headers", type=int, default=defaults.header_count,
        help="a record with more headers is malformed")
    add("--max-header-bytes", type=int, default=defaults.header_bytes,
        help="a record whose header keys and values (UTF-8) are larger is malformed")
    add("--max-producer-chars", type=int, default=defaults.producer_chars,
        help="a record whose producer id is longer is malformed")
    add("--clock-skew-s", type=float, default=defaults.clock_skew_ms / 1000,
        help="how far ahead of this job's clock a producer's may run (at most --grace-s)")
    add("--payload-schema", help="decode payloads with this schema (full name) into columns")
    add("--schema-dir", help="directory of .avsc schemas (default: eoguard's)")
    add("--starting-offsets", default="earliest", help="earliest, latest or a JSON offset map")
    add("--max-offsets-per-trigger", type=int, help="cap on records per micro-batch")
    trigger = p.add_mutually_exclusive_group()
    trigger.add_argument("--trigger", dest="trigger_interval",
                         help="processing-time trigger interval, e.g. '10 seconds'")
    trigger.add_argument("--available-now", action="store_true",
                         help="process everything available, then stop")
    add("--watermark-delay", default="10 minutes", help="watermark delay on created_at")
    add("--lease-s", type=float, default=300.0, help="claim lease; must outlast a batch")
    add("--grace-s", type=float, default=300.0, help="dedup keys live until expires_at + grace")
    add("--busy-wait-s", type=float, default=30.0,
        help="how long a claim held by another live reader is waited on before it is skipped")
    add("--claim-batch-size", type=int, default=2000, help="ids per Redis round trip")
    add("--no-dead-letter-expired", dest="dead_letter_expired", action="store_false",
        help="count expired records only; do not write them to the dead letters")
    add("--no-ack-outbox", dest="ack_outbox", action="store_false",
        help="do not acknowledge the senders' outbox records when marking done")
    add("--idempotent-sink", action="store_true",
        help="with spark.speculation=true, confirm a foreach_batch hook tolerates two attempts "
             "of a task (the job's own Parquet sink needs no confirmation)")
    add("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
        help="extra Kafka source option (e.g. kafka.security.protocol=SSL); repeatable")
    add("--query-name", help="name of the streaming query")
    add("--reader", help="this query's name in its claim positions (reader, topic, partition, "
                         "offset) and batch tokens; default spark-<12 hex digits of the query "
                         "id>, recorded in the checkpoint")
    add("--plain-format", choices=[f.value for f in PlainFormat],
        help="read records that are not envelopes as plain records of this format "
             "(docs/design.md §6); needs --plain-id-namespace, --plain-ttl-s and one of "
             "--plain-id-field or --plain-id-header")
    add("--plain-id-namespace", help="namespace of message_id_for(namespace, key)")
    add("--plain-id-field", help="top-level JSON or Avro field holding the business key")
    add("--plain-id-header", help="header whose (last) value is the business key")
    add("--plain-ttl-s", type=float, help="a plain record expires at its timestamp plus this")
    add("--plain-json-schema", help="Spark DDL schema a plain JSON value must match")
    add("--plain-avro-schema", metavar="JSON|@FILE",
        help="the reader schema of plain Avro values: its JSON, or @ and an .avsc file")
    add("--plain-avro-framing", choices=[f.value for f in AvroFraming],
        help="registry: a magic byte 0 and a 4-byte schema id before the body (Confluent's "
             "AvroSerializer; the id is not looked up); none: the Avro body alone")
    add("--header-format", action="store_true",
        help="read records in the header wire format (docs/design.md §3): the source reads "
             "headers; raw payloads need no registry, an Avro one stops the job asking for "
             "--schema-registry-url; without either option such records are dead letters")
    add("--schema-registry-url",
        help="Schema Registry (Confluent API) to read records in the header wire format "
             "(implies --header-format): Avro payloads are read by writer schema id")
    add("--schema-registry-option", action="append", default=[], metavar="KEY=VALUE",
        help="option of the Schema Registry client (e.g. basic.auth.user.info=u:p); repeatable")
    add("--master", default="local[2]", help="Spark master when not under spark-submit")
    add("--shuffle-partitions", type=int, default=4, help="spark.sql.shuffle.partitions")
    return p


def _text_or_file(value: str | None, option: str) -> str | None:
    """``value``, or with a leading ``@`` the text of the file it names (a schema's JSON never
    starts with ``@``)."""
    if value is None or not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} {value!r}: {exc}") from exc


def _pairs(items: list[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; ConfigError naming ``option`` for any other item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def endpoints(args: argparse.Namespace) -> tuple[str, str]:
    """Kafka and Redis as the ``eoguard`` command finds them: the flag, else
    ``EOGUARD_KAFKA_BOOTSTRAP`` / ``EOGUARD_REDIS_URL``, else the local stack's."""
    if args.bootstrap is not None and args.redis_url is not None:
        return args.bootstrap, args.redis_url
    from eoguard.stack import LocalStack  # noqa: PLC0415 - only when a flag is missing

    try:
        ends = LocalStack().endpoints()
    except StackError as exc:  # an unknown EOGUARD_TOPOLOGY
        raise ConfigError(str(exc)) from exc
    return args.bootstrap or ends.kafka_bootstrap, args.redis_url or ends.redis_url


def options_from(args: argparse.Namespace) -> JobOptions:
    kafka = _pairs(args.kafka_option, "--kafka-option")
    bootstrap, redis_url = endpoints(args)
    plain = None
    if args.plain_format is not None:
        if args.plain_id_namespace is None or args.plain_ttl_s is None:
            raise ConfigError("--plain-format needs --plain-id-namespace and --plain-ttl-s")
        plain = PlainOptions(format=PlainFormat(args.plain_format),
                             id_namespace=args.plain_id_namespace, ttl_s=args.plain_ttl_s,
                             json_schema=args.plain_json_schema, id_field=args.plain_id_field,
                             id_header=args.plain_id_header,
                             avro_schema=_text_or_file(args.plain_avro_schema,
                                                       "--plain-avro-schema"),
                             avro_framing=args.plain_avro_framing)
    return JobOptions(
        bootstrap=bootstrap, topics=tuple(args.topics), scope=args.scope,
        checkpoint=args.checkpoint, output_path=args.output_path,
        dead_letter_path=args.dead_letter_path, redis_url=redis_url,
        key_prefix=args.key_prefix, key_shards=args.key_shards,
        max_ttl_ms=int(args.max_ttl_s * 1000), dedup=DedupMode(args.dedup),
        payload_schema=args.payload_schema, schema_dir=args.schema_dir,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        trigger_interval=args.trigger_interval, available_now=args.available_now,
        watermark_delay=args.watermark_delay, lease_s=args.lease_s, grace_s=args.grace_s,
        busy_wait_s=args.busy_wait_s, claim_batch_size=args.claim_batch_size,
        dead_letter_expired=args.dead_letter_expired, ack_outbox=args.ack_outbox,
        idempotent_sink=args.idempotent_sink, kafka_options=kafka, query_name=args.query_name,
        reader=args.reader, plain=plain, schema_registry_url=args.schema_registry_url,
        header_format=args.header_format,
        schema_registry_options=_pairs(args.schema_registry_option, "--schema-registry-option"),
        input_limits=InputLimits(
            payload_bytes=args.max_payload_bytes, header_count=args.max_headers,
            header_bytes=args.max_header_bytes, producer_chars=args.max_producer_chars,
            clock_skew_ms=round(args.clock_skew_s * 1000)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = options_from(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # pyspark is imported only now, so --help and option errors need no JVM.
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from eoguard_spark.job import BatchStats, local_session, run  # noqa: PLC0415

    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit: its master, its jars
        spark = SparkSession.builder.appName("eoguard-spark").getOrCreate()
    else:
        spark = local_session(master=args.master, shuffle_partitions=args.shuffle_partitions)

    def report(stats: BatchStats) -> None:
        print(json.dumps({"batch": asdict(stats)}), flush=True)

    try:  # until it stops; started again when a batch meets a new schema id (job.run)
        run(options, spark=spark, on_batch=report)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SecurityError as exc:  # a refused login, an untrusted certificate: one line
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
