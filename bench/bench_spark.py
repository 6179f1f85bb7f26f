"""Spark job throughput against the local stack (a benchmark, not a test).

    python -m bench.bench_spark [--messages 200000] [--partitions 4] [--per-batch 50000]
                                [--rounds 3]

Pre-produces envelopes with an ``eoguard.example.Order`` payload (2% of them resent once more
at another offset), then runs the job over all of them on ``local[2]`` three ways, each with a
fresh checkpoint and output, after one discarded warm-up run of each. The three runs are
repeated ``--rounds`` times, interleaved (the order rotates each round), so a noisy machine
slows every mode alike; each mode reports its best and the range over rounds, and the
ratio (b)/(a) is given for the best runs and per round:

  (a) ``dedup="none"``: decode, expiry, dead letters and the idempotent Parquet sink only;
  (b) ``dedup="redis"``: (a) plus the claim pass and the done pass against Redis;
  (c) ``dedup="watermark"``: (a) plus ``dropDuplicatesWithinWatermark`` (state store).

Rows/s counts every Kafka record over the time spent inside the micro-batches (the sum of
``BatchStats.duration_s``); wall time from ``start()`` to the end is printed too.
Target: (b) >= 0.5 x (a).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from bench.bench_consumer import forget
from eoguard.codec import PayloadCodec
from eoguard.stack import LocalStack
from eoguard.stack.feed import envelope, produce
from eoguard_spark import BatchStats, DedupMode, JobOptions, build_query, local_session

ORDER = "eoguard.example.Order"


def make_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-spark-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name] \
        .result(timeout=30)
    return name


def fill(bootstrap: str, topic: str, messages: int) -> int:
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
    return produce(bootstrap, topic, envs) + produce(bootstrap, topic, resent)


def run_mode(spark: object, base: JobOptions, mode: DedupMode, root: Path, *,
             verbose: bool = False) -> tuple[float, float, int, dict[str, float]]:
    """(seconds inside batches, wall seconds, rows written, seconds per phase) of one run."""
    run_dir = root / f"{mode.value}-{uuid.uuid4().hex[:6]}"
    options = JobOptions(**{
        **{name: getattr(base, name) for name in base.__dataclass_fields__},
        "dedup": mode, "checkpoint": str(run_dir / "cp"), "output_path": str(run_dir / "out"),
        "dead_letter_path": str(run_dir / "dead"),
        "key_prefix": f"bs{uuid.uuid4().hex[:8]}"})
    stats: list[BatchStats] = []
    started = time.perf_counter()
    def report(batch: BatchStats) -> None:
        stats.append(batch)
        if verbose:
            print(f"    {mode.value} batch {batch.batch_id}: {batch.rows} in "
                  f"{batch.duration_s:.2f} s {batch.phases_s}", flush=True)

    query = build_query(spark, options, on_batch=report)  # type: ignore[arg-type]
    query.awaitTermination()
    wall = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{mode.value} run failed: {query.exception()}")
    inside = sum(s.duration_s for s in stats)
    written = sum(s.written for s in stats)
    phases: dict[str, float] = {}
    for batch in stats:
        for name, seconds in batch.phases_s.items():
            phases[name] = round(phases.get(name, 0.0) + seconds, 1)
    shutil.rmtree(run_dir, ignore_errors=True)
    forget(options.redis_url, f"{options.key_prefix}:*")  # 200k keys a run, TTL an hour
    return inside, wall, written, phases


def main(argv: Sequence[str] = ()) -> None:
    """Run the benchmark; ``argv`` are its options (``python -m bench spark`` passes none)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--per-batch", type=int, default=50_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each mode")
    parser.add_argument("--verbose", action="store_true", help="print every micro-batch")
    parser.add_argument("--claim-batch-size", type=int, default=500, help="ids per round trip")
    parser.add_argument("--no-ack-outbox", dest="ack_outbox", action="store_false",
                        help="skip the outbox acknowledgement in the done pass")
    args = parser.parse_args(list(argv))

    ends, started = LocalStack().up()
    root = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    topic = ""
    try:
        topic = make_topic(ends.kafka_bootstrap, args.partitions)
        t0 = time.perf_counter()
        total = fill(ends.kafka_bootstrap, topic, args.messages)
        print(f"produced {total} records to {topic} in {time.perf_counter() - t0:.1f} s")
        spark = local_session(master="local[2]", shuffle_partitions=2,
                              conf={"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        base = JobOptions(bootstrap=ends.kafka_bootstrap, topics=(topic,), scope="bench",
                          checkpoint="unused", redis_url=ends.redis_url, payload_schema=ORDER,
                          available_now=True, max_offsets_per_trigger=args.per_batch,
                          watermark_delay="1 hour", lease_s=600.0,
                          claim_batch_size=args.claim_batch_size, ack_outbox=args.ack_outbox)
        for mode in DedupMode:  # warm-up: JIT, Python workers and their imports, page cache
            run_mode(spark, base, mode, root)
        modes = [DedupMode.NONE, DedupMode.REDIS, DedupMode.WATERMARK]
        rates: dict[DedupMode, list[float]] = {mode: [] for mode in modes}
        for round_no in range(args.rounds):
            for mode in modes[round_no % 3:] + modes[:round_no % 3]:
                inside, wall, written, phases = run_mode(spark, base, mode, root,
                                                         verbose=args.verbose)
                rates[mode].append(total / inside)
                print(f"round {round_no + 1} ({'abc'[modes.index(mode)]}) {mode.value:<9} "
                      f"{total / inside:>9,.0f} rows/s in batches ({inside:5.1f} s), "
                      f"{total / wall:>9,.0f} rows/s wall ({wall:5.1f} s), {written} rows "
                      f"written, phases {phases}", flush=True)
        print(f"{total} records, local[2], {args.rounds} rounds, rows/s inside the batches:")
        for label, mode in zip("abc", modes, strict=True):
            got = rates[mode]
            print(f"  ({label}) {mode.value:<9} best {max(got):>9,.0f}  range "
                  f"{min(got):,.0f}-{max(got):,.0f}")
        per_round = [b / a for a, b in zip(rates[DedupMode.NONE], rates[DedupMode.REDIS],
                                           strict=True)]
        best = max(rates[DedupMode.REDIS]) / max(rates[DedupMode.NONE])
        print(f"ratio (b)/(a): best runs {best:.2f}, per round {min(per_round):.2f}-"
              f"{max(per_round):.2f}  (target >= 0.5)")
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if topic:
            AdminClient({"bootstrap.servers": ends.kafka_bootstrap}).delete_topics([topic])
        if started:
            LocalStack().down(started)


if __name__ == "__main__":
    main(sys.argv[1:])
