"""Run eoguard's Spark job over the orders topic: each order once in the Parquet output.

    python examples/orders_producer.py --count 100
    python examples/spark_orders.py --out orders-job

The job (``eoguard_spark``, installed from connectors/spark) reads the topic with Spark's
Kafka source, drops expired records and deduplicates against the same Redis keys as the
GuardedConsumers of ``--scope``: an order handled by either is dropped by the other. With
``available_now`` it takes what the topic holds, writes it (one ``batch_id=N`` directory per
micro-batch under ``<out>/output``) and stops; run again, it goes on from its checkpoint.
``python -m eoguard_spark --help`` lists every option of the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stack_args import stack_parser

from eoguard_spark import JobOptions, local_session, run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def main(argv: list[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """``spark``: a session to run in (default: a local one with the connector jars)."""
    parser = stack_parser(__doc__.split("\n")[0])
    parser.add_argument("--scope", default="analytics", help="the dedup scope")
    parser.add_argument("--out", default="eoguard-spark-orders",
                        help="directory of the checkpoint, the output and the dead letters")
    args = parser.parse_args(argv)
    out = Path(args.out)
    output = str(out / "output")
    options = JobOptions(bootstrap=args.bootstrap, topics=(args.topic,), scope=args.scope,
                         redis_url=args.redis, key_prefix=args.prefix,
                         checkpoint=str(out / "checkpoint"), output_path=output,
                         dead_letter_path=str(out / "dead"), available_now=True)
    session = spark or local_session()
    run(options, spark=session)
    rows = session.read.parquet(output).select("id").collect()
    print(f"{len(rows)} orders in {output}, {len({r['id'] for r in rows})} distinct")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
