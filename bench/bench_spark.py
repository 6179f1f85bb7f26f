"""Spark job throughput against a plain Structured Streaming query (a benchmark, not a test).

    python -m bench.bench_spark [--messages 200000] [--partitions 4] [--per-batch 50000]
                                [--rounds 3] [--modes plain,redis,...] [--bootstrap HOST:PORT]
                                [--redis-url URL]

Pre-produces envelopes with an ``eoguard.example.Order`` payload (2% of them resent once more
at another offset), then reads all of them on ``local[2]`` eight ways, each with a fresh
checkpoint and output, after one discarded warm-up run of each (``--modes`` picks some; the
plain query always runs):

  (p) ``plain``: the query a user would write without eoguard: the same Kafka source options
      and available-now trigger, ``from_avro`` of the envelope after the 10-byte header and of
      its payload, expired rows filtered, Parquet per batch through ``foreachBatch``;
  (a) ``none``: eoguard's job with ``dedup="none"``: decode, expiry, dead letters and the
      idempotent Parquet sink;
  (b) ``redis``: (a) plus the claims, the done mark and the outbox acknowledgement in Redis;
  (c) ``watermark``: (a) plus ``dropDuplicatesWithinWatermark`` (state store);
  (f) ``floor``: (p) plus one Arrow UDF over the columns the claim pass ships to Python
      (``id``, a position, ``expires_at``), answering ``new`` for every row without Redis: the
      Python worker round trip any executor-side dedup pays, so (b) can be read against it;
  (g) ``floor+redis``: (f) whose UDF also makes, with plain pipelined commands and no script,
      the Redis writes (b) makes per row (bench/spark_floor.py): a ``SET NX PXAT`` claim a row,
      per Arrow batch a done mark of its batch record and one ``DEL`` + ``ZREM`` outbox
      acknowledgement of its rows, two round trips a batch on one connection per Python
      worker. A floor of the work, not a design (no lease, no takeover, no replay): (b) over
      (g) says how close eoguard's Redis pass is to the least it could cost.
  (h) ``none+floor``: (a), eoguard's own job with ``dedup="none"``, whose ``transform`` adds
      (g)'s UDF (a row whose plain claim found the key is left out): the same decode, checks
      and sink as (b), with the cheapest Redis claims in place of eoguard's. (b) over (h) says
      what eoguard's claim machinery (scripts, positions, lease, done mark, acknowledgement
      pass) costs over plain commands.
  (i) ``decode``: (p) with eoguard's decode (``eoguard_spark.decode.decode``: the input rules,
      dead-letter columns) in place of its two ``from_avro`` calls, its ``ok`` rows written by
      (p)'s sink: (a) over (i) is the job's batch runner (observation, idempotent sink,
      ledger), (i) over (p) the decode.

The eight are repeated ``--rounds`` times, interleaved (the order rotates each round), so a
noisy machine slows every mode alike. Every run is timed the same way, by its query's progress
reports: rows/s is the Kafka records over the sum of ``triggerExecution`` of the batches that
had rows (plus, in the Redis mode, the wait for the last batch's outbox acknowledgement, which
runs in the background). Each mode reports min and median over rounds, and its ratio to the
plain query (medians, and per round); each round and the summary also give (b) over (g) and
(h) and the Redis server's CPU per row (INFO cpu around the run) of (b), (g) and (h), and the
summary each mode's CPU per row by process (driver, Spark's JVM, Python workers, Redis, the
rest). Targets: (a) >= 0.85 x
(p) in every round, (b) >= 0.75 x (p).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import redis
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.streaming.query import StreamingQuery

from bench import spark_floor, table
from bench.bench_consumer import forget
from bench.machine_cpu import busy_cpu_s, redis_cpu_s, tree_cpu_s
from eoguard.codec import (
    ENVELOPE_SCHEMA,
    HEADER_SIZE,
    EnvelopeCodec,
    PayloadCodec,
    SchemaRegistry,
)
from eoguard.stack import LocalStack
from eoguard.stack.feed import envelope, produce
from eoguard_spark import DedupMode, JobOptions, build_query, local_session, wait_for_acks
from eoguard_spark.decode import OUTPUT_COLUMNS, RowStatus, decode

ORDER = "eoguard.example.Order"
PLAIN = "plain"
FLOOR = "floor"
FLOOR_REDIS = "floor+redis"
NONE_REDIS = "none+floor"
DECODE = "decode"
REDIS = DedupMode.REDIS.value
MODES = (PLAIN, DedupMode.NONE.value, REDIS, DedupMode.WATERMARK.value, FLOOR, FLOOR_REDIS,
         NONE_REDIS, DECODE)
LABELS = dict(zip(MODES, "pabcfghi", strict=True))
PYTHON_PASS = (FLOOR, FLOOR_REDIS)  # the plain query with an Arrow UDF
JOB_MODES = tuple(mode.value for mode in DedupMode)  # (h) is the job with dedup="none"
CPU_ROLES = ("driver", "jvm", "workers", "redis", "rest")  # bench.machine_cpu's, Redis, the rest


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-spark-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name] \
        .result(timeout=30)
    return name


def fill(bootstrap: str, topic: str, messages: int) -> tuple[int, float]:
    """Produce the workload; (records, mean record value size in bytes)."""
    payloads = PayloadCodec()
    created = dt.datetime.now(dt.timezone.utc)
    envs = []
    for i in range(messages):
        order = {"order_id": f"o-{i}", "customer": f"c-{i % 997}", "amount": Decimal(i % 10_000) / 100,
                 "currency": "EUR", "items": [{"sku": f"s-{i % 50}", "qty": 1 + i % 3,
                                               "unit_price": 9.99}],
                 "created_at": created, "express": i % 7 == 0, "attributes": {"channel": "web"},
                 "note": None}
        envs.append(envelope(payloads.encode(order, ORDER), ttl_ms=3_600_000,
                             payload_schema=ORDER))
    resent = [e.with_attempt(2) for e in envs[:: 50]]
    codec = EnvelopeCodec()
    size = sum(len(codec.encode(e)) for e in envs[:1000]) / min(len(envs), 1000)
    return produce(bootstrap, topic, envs) + produce(bootstrap, topic, resent), size


def progress_s(query: StreamingQuery) -> float:
    """Seconds the query spent in its batches that had rows, by its own progress reports."""
    return sum(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress
               if p.numInputRows) / 1000


def floor_claims(base: JobOptions, mode: str, expires_ms: Column) -> Column:
    """The status column of a floor's Arrow UDF over (id, position, expiry; and ``status`` in
    (h)): (f) answers ``new`` without Redis, (g) and (h) claim with plain commands
    (bench/spark_floor.py)."""
    redis_url, prefix = base.redis_url, base.key_prefix

    def claim_plainly(batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        return spark_floor.claim_plainly(redis_url, prefix, batches)

    def claim_ok_rows(batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        return spark_floor.claim_ok_rows(redis_url, prefix, batches)

    udfs = {FLOOR: spark_floor.answer_new, FLOOR_REDIS: claim_plainly, NONE_REDIS: claim_ok_rows}
    make_udf: Any = arrow_udf  # the stubs want functionType= for iterator UDFs
    claim = make_udf(udfs[mode], "string").asNondeterministic()
    position = F.concat_ws("|", F.col("partition").cast("string"), F.col("offset").cast("string"))
    inputs = [F.col("id"), position, expires_ms] + ([F.col("status")] if mode == NONE_REDIS else [])
    column: Column = claim(*inputs)
    return column


def plain_query(spark: SparkSession, base: JobOptions, run_dir: Path, mode: str = PLAIN
                ) -> StreamingQuery:
    """The query a user would write without eoguard (the module docstring's (p)), with a
    floor's Arrow UDF (``mode`` (f) or (g)), or with eoguard's decode (i)."""
    registry = SchemaRegistry.default()
    raw = spark.readStream.format("kafka").options(**base.source_options()).load()
    if mode == DECODE:
        limits = base.input_limits.within_grace(int(base.grace_s * 1000))  # as the job's
        rows = (decode(raw, registry, payload_schema=ORDER, max_ttl_ms=base.max_ttl_ms,
                       limits=limits)
                .filter(F.col("status") == RowStatus.OK.value).select(*OUTPUT_COLUMNS))
    else:
        envelope_json = json.dumps(registry.get(ENVELOPE_SCHEMA).schema)
        order_json = json.dumps(registry.get(ORDER).schema)
        body = F.expr(f"substring(value, {HEADER_SIZE + 1}, length(value) - {HEADER_SIZE})")
        rows = (raw.select(from_avro(body, envelope_json, {"mode": "PERMISSIVE"}).alias("e"),
                           "key", "topic", "partition", "offset",
                           F.col("timestamp").alias("kafka_timestamp"))
                .select("e.*", "key", "topic", "partition", "offset", "kafka_timestamp")
                .filter(F.col("expires_at") > F.current_timestamp())
                .withColumn("payload", from_avro("payload", order_json, {"mode": "PERMISSIVE"})))
    if mode in PYTHON_PASS:
        rows = rows.withColumn("status", floor_claims(base, mode, F.unix_millis("expires_at"))) \
            .filter(F.col("status") == "new")
    out = run_dir / "out"

    def sink(df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(out / f"batch_id={batch_id}"))

    return (rows.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(run_dir / "cp"))
            .trigger(availableNow=True).start())


def claimed_plainly(options: JobOptions, rows: DataFrame) -> DataFrame:
    """(h): the decoded rows of ``dedup="none"`` with (g)'s plain claims of the ``ok`` rows: a
    row whose claim found the key is a ``duplicate``, left out as the job leaves out any status
    but ``ok``. The claims run once per row only in a batch without dead letters (the job
    reads a batch again for them, uncached): the workload has none."""
    return rows.withColumn("status", floor_claims(options, NONE_REDIS, F.col("expires_at_ms")))


def run_mode(spark: SparkSession, base: JobOptions, mode: str, root: Path
             ) -> tuple[float, float, dict[str, float]]:
    """(seconds inside batches by the query's progress, wall seconds, seconds per eoguard
    phase) of one run of ``mode``."""
    run_dir = root / f"{mode}-{uuid.uuid4().hex[:6]}"
    phases: dict[str, float] = {}
    options = JobOptions(**{
        **{name: getattr(base, name) for name in base.__dataclass_fields__},
        "dedup": DedupMode(mode) if mode in JOB_MODES else DedupMode.NONE,
        "checkpoint": str(run_dir / "cp"), "output_path": str(run_dir / "out"),
        "dead_letter_path": str(run_dir / "dead"), "key_prefix": f"bs{uuid.uuid4().hex[:8]}"})
    server = redis.Redis.from_url(base.redis_url)
    cpu_before = redis_cpu_s(server)
    tree_before, busy_before = tree_cpu_s(), busy_cpu_s()
    started = time.perf_counter()
    if mode in (PLAIN, DECODE) or mode in PYTHON_PASS:
        query = plain_query(spark, options, run_dir, mode)
    else:
        def report(batch: Any) -> None:
            for name, seconds in batch.phases_s.items():
                phases[name] = round(phases.get(name, 0.0) + seconds, 1)

        query = build_query(spark, options, on_batch=report, transform=None
                            if mode != NONE_REDIS else functools.partial(claimed_plainly, options))
    query.awaitTermination()
    waited = time.perf_counter()
    wait_for_acks(query)  # the last batch's acknowledgement pass, run in the background
    waited = time.perf_counter() - waited
    wall = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{mode} run failed: {query.exception()}")
    inside = progress_s(query) + waited  # the wait is the last batch's, so it counts too
    phases["redis cpu"] = round(redis_cpu_s(server) - cpu_before, 2)
    tree = {role: cpu - tree_before[role] for role, cpu in tree_cpu_s().items()}
    for role, cpu in tree.items():
        phases[f"{role} cpu"] = round(cpu, 2)
    # Everything else busy meanwhile: Kafka's broker, and anything else running.
    phases["rest cpu"] = round(busy_cpu_s() - busy_before - sum(tree.values())
                               - phases["redis cpu"], 2)
    server.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    if mode in (REDIS, FLOOR_REDIS, NONE_REDIS):
        forget(options.redis_url, f"{options.key_prefix}:*")  # 200k keys a run, TTL an hour
    return inside, wall, phases


def summary(rates: dict[str, list[float]]) -> None:
    """Each mode's min and median rows/s and its ratio to the plain query, and the targets."""
    plain = statistics.median(rates[PLAIN])
    for mode, got in rates.items():
        median = statistics.median(got)
        per_round = [r / p for r, p in zip(got, rates[PLAIN], strict=True)]
        print(f"  ({LABELS[mode]}) {mode:<11} min {min(got):>9,.0f}  median {median:>9,.0f}"
              f"  x plain: median {median / plain:.2f}, per round "
              f"{min(per_round):.2f}-{max(per_round):.2f}")
    floor = ""
    if REDIS in rates and FLOOR in rates:
        ratio = statistics.median(rates[REDIS]) / statistics.median(rates[FLOOR])
        floor = f"; (b) x floor (f): {ratio:.2f}"
    print(f"targets: (a) none >= 0.85 x plain in every round, (b) redis >= 0.75 x plain{floor}")


def against_floor(rates: dict[str, list[float]], cpu_us: dict[str, dict[str, list[float]]],
                  round_index: int | None = None) -> str:
    """(b) over (g) and (h), and the Redis CPU per row of each, in one round (``round_index``) or on
    medians over rounds (None); the part of it the modes run allow."""
    def pick(values: list[float]) -> float:
        return statistics.median(values) if round_index is None else values[round_index]

    parts = [f"({LABELS[mode]}) {mode} {pick(cpu_us[mode]['redis']):.1f} us of Redis CPU a row"
             for mode in (REDIS, FLOOR_REDIS, NONE_REDIS) if mode in rates]
    for floor in (NONE_REDIS, FLOOR_REDIS):
        if REDIS in rates and floor in rates:
            parts.insert(0, f"(b) redis x ({LABELS[floor]}) {floor} "
                            f"{pick(rates[REDIS]) / pick(rates[floor]):.2f}")
    return "; ".join(parts) or "no Redis mode run"


def cpu_table(cpu_us: dict[str, dict[str, list[float]]]) -> None:
    """Each mode's CPU per row by process (medians over rounds, microseconds): where a mode's
    extra cost over another goes, on cores every process shares."""
    print("CPU a row by process, us (medians over rounds; rest: Kafka and anything else):")
    print(f"  {'mode':<15}" + "".join(f"{role:>9}" for role in (*CPU_ROLES, "total")))
    for mode, roles in cpu_us.items():
        medians = [statistics.median(roles[role]) for role in CPU_ROLES]
        print(f"  ({LABELS[mode]}) {mode:<11}" + "".join(f"{m:>9.1f}" for m in medians)
              + f"{sum(medians):>9.1f}")


def main(argv: Sequence[str] = ()) -> None:
    """Run the benchmark; ``argv`` are its options (``python -m bench spark`` passes none)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--per-batch", type=int, default=50_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each mode")
    parser.add_argument("--claim-batch-size", type=int, default=2000, help="ids per round trip")
    parser.add_argument("--no-ack-outbox", dest="ack_outbox", action="store_false",
                        help="skip the outbox acknowledgement in the done pass")
    parser.add_argument("--bootstrap", help="Kafka to use (default: the local stack's)")
    parser.add_argument("--redis-url", help="Redis to use (default: the local stack's)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {','.join(MODES)} (plain always runs)")
    args = parser.parse_args(list(argv))
    wanted = set(args.modes.split(",")) | {PLAIN}
    if wanted - set(MODES):
        parser.error(f"unknown mode(s) {sorted(wanted - set(MODES))}; choose from {MODES}")
    modes = tuple(mode for mode in MODES if mode in wanted)

    stack = LocalStack()
    ends, started = stack.up() if not (args.bootstrap and args.redis_url) else (None, [])
    bootstrap = args.bootstrap or (ends.kafka_bootstrap if ends else "")
    redis_url = args.redis_url or (ends.redis_url if ends else "")
    root = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    topic = ""
    try:
        topic = make_topic(bootstrap, args.partitions)
        t0 = time.perf_counter()
        total, size = fill(bootstrap, topic, args.messages)
        print(f"produced {total} records ({size:.0f} bytes each on average) to {topic} in "
              f"{time.perf_counter() - t0:.1f} s")
        spark = local_session(master="local[2]", shuffle_partitions=2,
                              conf={"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        base = JobOptions(bootstrap=bootstrap, topics=(topic,), scope="bench",
                          checkpoint="unused", redis_url=redis_url, payload_schema=ORDER,
                          available_now=True, max_offsets_per_trigger=args.per_batch,
                          watermark_delay="1 hour", lease_s=600.0,
                          claim_batch_size=args.claim_batch_size, ack_outbox=args.ack_outbox)
        for mode in modes:  # warm-up: JIT, Python workers and their imports, page cache
            run_mode(spark, base, mode, root)
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        cpu_us: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}  # by role
        for round_no in range(args.rounds):
            shift = round_no % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                inside, wall, phases = run_mode(spark, base, mode, root)
                rates[mode].append(total / inside)
                for role in CPU_ROLES:
                    cpu_us[mode].setdefault(role, []).append(phases[f"{role} cpu"] * 1e6 / total)
                print(f"round {round_no + 1} ({LABELS[mode]}) {mode:<11} "
                      f"{total / inside:>9,.0f} rows/s in batches ({inside:5.1f} s), "
                      f"{total / wall:>9,.0f} rows/s wall ({wall:5.1f} s), phases {phases}",
                      flush=True)
            print(f"round {round_no + 1}: {against_floor(rates, cpu_us, -1)}", flush=True)
        print(f"{total} records of {size:.0f} bytes, maxOffsetsPerTrigger {args.per_batch}, "
              f"local[2], {args.rounds} rounds; rows/s inside the batches (query progress):")
        summary(rates)
        print(f"medians: {against_floor(rates, cpu_us)}")
        cpu_table(cpu_us)
        for mode in modes:
            table.add(table.Row(suite="spark", path=mode, rates=rates[mode],
                                baseline=None if mode == PLAIN else PLAIN,
                                note=f"{total} x {size:.0f} B, {args.per_batch} per batch"))
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if topic:
            AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])
        if started:
            stack.down(started)


if __name__ == "__main__":
    main(sys.argv[1:])
